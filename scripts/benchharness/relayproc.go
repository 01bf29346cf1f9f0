package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// relayProc is a real `outboxd relay` process: the scenarios that measure
// what a deployment costs (CPU, memory, shutdown) run the shipped binary
// with its defaults plus -relay-args, not the library in this process.
type relayProc struct {
	cmd    *exec.Cmd
	admin  string // host:port of its admin server
	exited chan struct{}
	exitAt time.Time
	err    error
	log    *tailBuffer

	peak *peakSampler
}

// startRelay starts `outboxd relay` on schemaName delivering only index
// name's events to esURL (the harness's proxy in front of Elasticsearch),
// and waits until its /readyz answers 200.
func (b *bench) startRelay(ctx context.Context, schemaName, index, esURL string, extra ...string) (*relayProc, error) {
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	args := []string{"relay", "--schema", schemaName, "--indexes", index,
		"--elasticsearch-url", esURL, "--admin-addr", addr, "--upgrade-layouts=false"}
	args = append(args, extra...)
	args = append(args, strings.Fields(b.cfg.relayArgs)...)
	cmd := exec.Command(b.cfg.outboxd, args...)
	cmd.Env = os.Environ()
	p := &relayProc{cmd: cmd, admin: addr, exited: make(chan struct{}), log: &tailBuffer{max: 8 << 10}}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w (scripts/bench builds it; or set -outboxd)", b.cfg.outboxd, err)
	}
	p.peak = samplePeak(cmd.Process.Pid, 100*time.Millisecond)
	go func() {
		p.err = cmd.Wait()
		p.peak.end()
		p.exitAt = time.Now()
		close(p.exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if ready(ctx, "http://"+addr+"/readyz") {
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("outboxd relay exited before ready: %v: %s", p.err, p.log.String())
		case <-ctx.Done():
			p.kill()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, fmt.Errorf("outboxd relay not ready after 60s: %s", p.log.String())
		}
	}
}

func ready(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func (p *relayProc) pid() int { return p.cmd.Process.Pid }

// peakRSS is the process's VmHWM now (or the last sampled one).
func (p *relayProc) peakRSS() int64 { return p.peak.now() }

// stop sends SIGTERM and returns how long the process took to exit.
func (p *relayProc) stop(timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.kill()
		return 0, fmt.Errorf("outboxd relay still running %s after SIGTERM (killed): %s", timeout, p.log.String())
	}
	if p.err != nil {
		return 0, fmt.Errorf("outboxd relay: %v: %s", p.err, p.log.String())
	}
	return p.exitAt.Sub(start), nil
}

// kill ends the process at once (cleanup after a failure).
func (p *relayProc) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// tailBuffer keeps the last max bytes a child wrote, for error messages.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(t.buf.String())
}

// pause waits d between two polls of a measurement that needs the relay,
// and says why the measurement cannot go on: the relay exited, or ctx
// ended.
func (p *relayProc) pause(ctx context.Context, d time.Duration) error {
	select {
	case <-p.exited:
		return fmt.Errorf("outboxd relay exited: %v: %s", p.err, p.log.String())
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// relayArgsShown is -relay-args for a report line, with a trailing space.
func relayArgsShown(args string) string {
	if f := strings.Fields(args); len(f) > 0 {
		for i, a := range f {
			// A URL given to the relay (--database-url) may carry a
			// password: the report shows it as url.Redacted does.
			if u, err := url.Parse(a); err == nil && u.User != nil {
				f[i] = u.Redacted()
			}
		}
		return strings.Join(f, " ") + " "
	}
	return ""
}

// warmRelay is an `outboxd relay` child on a fresh schema and index behind
// proxy that has delivered one event (doc-0, which creates the index and is
// not part of any measurement), so what follows measures a relay after work.
type warmRelay struct {
	schema, index string
	ob            *outbox.Outbox
	at            *ackTimes // sized for events 1..n
	p             *relayProc
	unwatch       func()
}

func (b *bench) startWarmRelay(ctx context.Context, proxy *esProxy, n int, extra ...string) (*warmRelay, error) {
	s, err := b.newSchema(ctx)
	if err != nil {
		return nil, err
	}
	ob, err := outbox.NewOutbox(s)
	if err != nil {
		return nil, err
	}
	w := &warmRelay{schema: s, index: b.newIndexName(), ob: ob, at: newAckTimes(n)}
	w.unwatch = w.at.watch(proxy)
	if w.p, err = b.startRelay(ctx, s, w.index, proxy.url, extra...); err != nil {
		w.unwatch()
		return nil, err
	}
	if err := b.appendEvent(ctx, ob, w.index, 0, rawDoc(0)); err != nil {
		w.close()
		return nil, err
	}
	if err := w.at.waitAcked(ctx, 1, time.Minute, w.p); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// close kills the relay if it still runs and stops watching the proxy.
func (w *warmRelay) close() {
	w.p.kill()
	w.unwatch()
}
