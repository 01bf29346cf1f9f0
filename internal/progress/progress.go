// Package progress reports the count and rate of an operator tool's long
// task (a scan, a repair, a backfill, a rebuild) as a bar on a terminal or
// as slog lines otherwise. The tools take a *Bar in their options; nil is
// silence, so library callers pass nothing.
package progress

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Bar reports a long task's count and rate: a redrawn bar when out is
// a terminal, a plain slog line every interval otherwise (logs and cron
// mail must not fill with carriage returns). A nil *Bar is a valid
// no-op, so library callers that want silence pass nothing.
type Bar struct {
	task     string
	out      io.Writer
	tty      bool
	logger   *slog.Logger
	interval time.Duration
	start    time.Time
	total    atomic.Int64
	done     atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

// Options configures New.
type Options struct {
	// Out is where the bar is drawn. It is treated as a terminal only when
	// it is an *os.File whose mode is a character device; nil means
	// os.Stderr.
	Out io.Writer
	// Logger receives the periodic lines when Out is not a terminal; nil
	// discards them.
	Logger *slog.Logger
	// Interval between redraws or log lines; 0 means 200ms on a terminal
	// and 10s otherwise.
	Interval time.Duration
}

// New starts reporting task. total may be 0 (unknown) and set
// later with SetTotal. Call Finish when the task ends.
func New(task string, total int64, opts Options) *Bar {
	out := opts.Out
	if out == nil {
		out = os.Stderr
	}
	p := &Bar{task: task, out: out, tty: isTerminal(out), logger: opts.Logger, stop: make(chan struct{}), start: time.Now()}
	if p.logger == nil {
		p.logger = slog.New(slog.DiscardHandler)
	}
	p.interval = opts.Interval
	if p.interval <= 0 {
		p.interval = 10 * time.Second
		if p.tty {
			p.interval = 200 * time.Millisecond
		}
	}
	p.total.Store(total)
	p.wg.Add(1)
	go p.loop()
	return p
}

// isTerminal checks the file mode instead of calling isatty: no
// dependency, and a char device is what a terminal is to the kernel.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Add counts n more items done.
func (p *Bar) Add(n int64) {
	if p != nil {
		p.done.Add(n)
	}
}

// SetTotal sets the expected count (0 = unknown).
func (p *Bar) SetTotal(n int64) {
	if p != nil {
		p.total.Store(n)
	}
}

// Finish stops reporting and prints the final count once.
func (p *Bar) Finish() {
	if p == nil {
		return
	}
	p.once.Do(func() {
		close(p.stop)
		p.wg.Wait()
		p.report(true)
	})
}

func (p *Bar) loop() {
	defer p.wg.Done()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.report(false)
		}
	}
}

func (p *Bar) report(final bool) {
	done, total := p.done.Load(), p.total.Load()
	elapsed := time.Since(p.start)
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(done) / s
	}
	if !p.tty {
		args := []any{"task", p.task, "done", done, "rate_per_s", int64(rate), "elapsed", elapsed.Round(time.Second).String()}
		if total > 0 {
			args = append(args, "total", total)
		}
		msg := "progress"
		if final {
			msg = "progress finished"
		}
		p.logger.Info(msg, args...)
		return
	}
	fmt.Fprint(p.out, "\r\033[K"+line(p.task, done, total, rate, elapsed))
	if final {
		fmt.Fprintln(p.out)
	}
}

// line renders one bar line; split out so it is testable.
func line(task string, done, total int64, rate float64, elapsed time.Duration) string {
	const width = 30
	if total <= 0 {
		return fmt.Sprintf("%s %d done  %.0f/s  %s", task, done, rate, elapsed.Round(time.Second))
	}
	frac := float64(done) / float64(total)
	if frac > 1 {
		frac = 1
	}
	filled := int(frac * width)
	eta := "?"
	if rate > 0 && done < total {
		eta = (time.Duration(float64(total-done)/rate) * time.Second).Round(time.Second).String()
	} else if done >= total {
		eta = "0s"
	}
	return fmt.Sprintf("%s [%s%s] %d/%d %5.1f%%  %.0f/s  eta %s", task,
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total, frac*100, rate, eta)
}
