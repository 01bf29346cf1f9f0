package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// childResult is what a relay child reports on stdout.
type childResult struct {
	Events   int64   `json:"events"`
	Seconds  float64 `json:"seconds"`
	Rate     float64 `json:"rate"`
	VmHWMKB  int64   `json:"vmhwm_kb"`  // peak resident set of the child
	HeapPeak uint64  `json:"heap_peak"` // Go heap in use, sampled
	CPU      float64 `json:"-"`         // user+system seconds of the child, from its rusage
}

// countingSink is the no-op sink: it acknowledges everything and counts.
type countingSink struct {
	n      atomic.Int64
	expect int64
	done   chan struct{}
	ok     []outbox.Outcome
}

func newCountingSink(expect int64) *countingSink {
	return &countingSink{expect: expect, done: make(chan struct{})}
}

func (s *countingSink) Write(_ context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	// One shared, read-only slice of Applied: a sink that allocates
	// nothing, so the measurement is the relay's alone.
	if len(s.ok) < len(events) {
		s.ok = make([]outbox.Outcome, len(events))
		for i := range s.ok {
			s.ok[i] = outbox.Outcome{Status: outbox.Applied}
		}
	}
	if n := s.n.Add(int64(len(events))); n >= s.expect && n-int64(len(events)) < s.expect {
		close(s.done)
	}
	return s.ok[:len(events)], nil
}

// relayChild drains one backlog with a no-op sink in a process of its
// own, so that its peak RSS is the relay's, and reports the result as one
// JSON line.
func relayChild(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("relay-child", flag.ContinueOnError)
	schemaName := fs.String("schema", "", "outbox schema")
	expect := fs.Int64("expect", 0, "events to wait for")
	pageDocs := fs.Int("page-docs", 2000, "relay MaxBatchDocs")
	prefetch := fs.Int("prefetch", 2, "relay Prefetch")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *schemaName == "" || *expect < 1 {
		return fmt.Errorf("relay-child: -schema and -expect are required")
	}
	pc, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "benchharness"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()

	sink := newCountingSink(*expect)
	r, err := relay.New(relay.Config{
		Pool: pool, Schema: *schemaName, Sink: sink,
		MaxBatchDocs: *pageDocs, Prefetch: *prefetch,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	var heapPeak atomic.Uint64
	stopSampling := make(chan struct{})
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > heapPeak.Load() {
					heapPeak.Store(ms.HeapInuse)
				}
			}
		}
	}()

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- r.Run(rctx) }()
	select {
	case <-sink.done:
	case err := <-errc:
		return fmt.Errorf("relay stopped after %d of %d events: %v", sink.n.Load(), *expect, err)
	case <-ctx.Done():
		return ctx.Err()
	}
	elapsed := time.Since(start)
	close(stopSampling)
	cancel()
	if err := <-errc; err != nil {
		return fmt.Errorf("relay shutdown: %w", err)
	}
	res := childResult{
		Events: sink.n.Load(), Seconds: elapsed.Seconds(), Rate: float64(sink.n.Load()) / elapsed.Seconds(),
		VmHWMKB: procStatusKB("self", "VmHWM"), HeapPeak: heapPeak.Load(),
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// peakSampler keeps the largest VmHWM of a child process. VmHWM is itself
// a peak, but it is gone once the process is reaped: sampling while it
// runs keeps the last moments too.
type peakSampler struct {
	pid  string
	kb   atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func samplePeak(pid int, every time.Duration) *peakSampler {
	s := &peakSampler{pid: strconv.Itoa(pid), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.now()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// now reads VmHWM once more and returns the largest seen, kB.
func (s *peakSampler) now() int64 {
	if v := procStatusKB(s.pid, "VmHWM"); v > s.kb.Load() {
		s.kb.Store(v)
	}
	return s.kb.Load()
}

// end stops sampling and returns the largest VmHWM seen, kB.
func (s *peakSampler) end() int64 {
	close(s.stop)
	<-s.done
	return s.kb.Load()
}

// procStatusKB reads one "Key: N kB" line of /proc/<pid>/status.
func procStatusKB(pid, key string) int64 {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return -1
}

// runChild drains the schema's backlog of n events in a relay child and
// returns its report. The parent also samples the child's VmHWM from
// /proc while it runs, as a cross-check of what the child says.
func (b *bench) runChild(ctx context.Context, schemaName string, n int, pageDocs int, profile string) (childResult, error) {
	args := []string{"relay-child", "-schema", schemaName, "-expect", strconv.Itoa(n),
		"-page-docs", strconv.Itoa(pageDocs), "-prefetch", strconv.Itoa(b.cfg.prefetch)}
	if profile != "" {
		args = append(args, "-cpuprofile", profile)
	}
	cmd := exec.CommandContext(ctx, b.self, args...)
	if b.cfg.childGOGC != "" {
		// An experiment knob: the relay's live heap is a few MB, so the
		// default GOGC=100 collects very often while draining.
		cmd.Env = append(os.Environ(), "GOGC="+b.cfg.childGOGC)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return childResult{}, err
	}
	peak := samplePeak(cmd.Process.Pid, 200*time.Millisecond)
	err := cmd.Wait()
	sampled := peak.end()
	if err != nil {
		return childResult{}, fmt.Errorf("relay child: %w", err)
	}
	var res childResult
	if err := json.NewDecoder(io.LimitReader(&out, 1<<20)).Decode(&res); err != nil {
		return childResult{}, fmt.Errorf("relay child: bad report %q: %w", out.String(), err)
	}
	res.CPU = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	if sampled > res.VmHWMKB {
		res.VmHWMKB = sampled
	}
	return res, nil
}
