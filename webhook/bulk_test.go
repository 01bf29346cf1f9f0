package webhook_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/webhook"
)

// switchable is a receiver that hangs (no answer in time), refuses (400)
// or accepts, as the test says, and counts the requests per webhook-id.
type switchable struct {
	*httptest.Server
	mode     atomic.Value // "hang", "refuse" or "ok"
	mu       sync.Mutex
	requests map[string]int
}

func newSwitchable(t *testing.T, mode string) *switchable {
	s := &switchable{requests: map[string]int{}}
	s.mode.Store(mode)
	closed := make(chan struct{})
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body first: only then does the server notice a client
		// that gave up (and cancel r.Context()).
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.requests[r.Header.Get(webhook.HeaderID)]++
		s.mu.Unlock()
		switch s.mode.Load() {
		case "hang":
			select {
			case <-r.Context().Done():
			case <-closed:
			}
		case "refuse":
			http.Error(w, "broken", http.StatusBadRequest)
		}
	}))
	t.Cleanup(func() { close(closed); s.CloseClientConnections(); s.Close() })
	return s
}

func (s *switchable) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[key]
}

func (e *env) auditActions(t *testing.T) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT action || ':' || coalesce(detail->>'count', '1') FROM "`+e.schema+`".audit_log ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		out = append(out, s)
	}
	return out
}

// Unknown messages are settled in bulk, audited with a count; a retry of
// once-unknown messages warns that it may give a second effect.
func TestResolveAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	rcv := newSwitchable(t, "hang")
	d := destination("bulk", rcv.URL, false)
	other := destination("other", rcv.URL, false)
	stop := e.run(t, d, other)
	for i := range 5 {
		e.send(t, "bulk", fmt.Sprint("k", i), `{}`)
	}
	e.send(t, "other", "k0", `{}`)
	for i := range 5 {
		e.waitState(t, "bulk", fmt.Sprint("k", i), webhook.StateUnknown)
	}
	e.waitState(t, "other", "k0", webhook.StateUnknown)
	stop()

	for _, sel := range []webhook.Selection{{State: webhook.StateUnknown}, {Destination: "bulk", State: webhook.StateReserved}, {Destination: "bulk", State: webhook.StateDelivered}} {
		if _, err := webhook.ResolveAll(ctx, e.pool, e.schema, sel, webhook.ResolveFailed, "alice"); err == nil {
			t.Fatalf("%+v was accepted", sel)
		}
	}
	if res, err := webhook.ResolveAll(ctx, e.pool, e.schema, webhook.Selection{Destination: "bulk", State: webhook.StateUnknown, Since: time.Now().Add(time.Hour)}, webhook.ResolveFailed, "alice"); err != nil || res.Count != 0 {
		t.Fatalf("since the future: %+v %v", res, err)
	}
	res, err := webhook.ResolveAll(ctx, e.pool, e.schema, webhook.Selection{Destination: "bulk", State: webhook.StateUnknown}, webhook.ResolveFailed, "alice")
	if err != nil || res.Count != 5 || len(res.Warnings) != 0 {
		t.Fatalf("resolve --failed: %+v %v", res, err)
	}
	if got := e.delivery(t, "other", "k0").State; got != webhook.StateUnknown {
		t.Fatalf("another destination's message was resolved: %s", got)
	}
	// Once unknown, then failed by hand: a retry may be a second effect.
	rcv.mode.Store("ok")
	res, err = webhook.ResolveAll(ctx, e.pool, e.schema, webhook.Selection{Destination: "bulk", State: webhook.StateFailed}, webhook.ResolveRetry, "alice")
	if err != nil || res.Count != 5 || len(res.Warnings) != 5 || !strings.Contains(res.Warnings[0], "second effect") {
		t.Fatalf("resolve --retry: %+v %v", res, err)
	}
	e.run(t, d, other)
	for i := range 5 {
		e.waitState(t, "bulk", fmt.Sprint("k", i), webhook.StateDelivered)
	}
	if got := strings.Join(e.auditActions(t), " "); got != "deliveries.resolve_all:0 deliveries.resolve_all:5 deliveries.resolve_all:5" {
		t.Fatalf("audit_log: %s", got)
	}
}

// `resolve --failed` then `--retry` of a message that was once unknown
// warns, even after an intermediate retry cleared its uncertainty.
func TestResolveRetryOfOnceUnknownWarns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	rcv := newSwitchable(t, "hang")
	d := destination("warn", rcv.URL, false)
	stop := e.run(t, d)
	e.send(t, "warn", "k", `{}`)
	e.waitState(t, "warn", "k", webhook.StateUnknown)
	stop()
	if _, err := webhook.Resolve(ctx, e.pool, e.schema, "warn", "k", webhook.ResolveFailed, "bob"); err != nil {
		t.Fatal(err)
	}
	got, err := webhook.Resolve(ctx, e.pool, e.schema, "warn", "k", webhook.ResolveRetry, "bob")
	if err != nil || !strings.Contains(got.Warning, "second effect") {
		t.Fatalf("failed then retry of a once-unknown message: warning %q, %v", got.Warning, err)
	}
	// The retry is refused by the receiver (400): failed again, and its
	// own attempt was answered; the key was still unknown once.
	rcv.mode.Store("refuse")
	stop = e.run(t, d)
	e.waitState(t, "warn", "k", webhook.StateFailed)
	stop()
	if got, err = webhook.Resolve(ctx, e.pool, e.schema, "warn", "k", webhook.ResolveRetry, "bob"); err != nil || got.Warning == "" {
		t.Fatalf("second retry: warning %q, %v", got.Warning, err)
	}
	// A message that was only ever refused retries without a warning.
	stop = e.run(t, d)
	e.send(t, "warn", "plain", `{}`)
	e.waitState(t, "warn", "plain", webhook.StateFailed)
	stop()
	if got, err = webhook.Resolve(ctx, e.pool, e.schema, "warn", "plain", webhook.ResolveRetry, "bob"); err != nil || got.Warning != "" {
		t.Fatalf("a refused message: warning %q, %v", got.Warning, err)
	}
}

// A receiver that lost what it acknowledged gets it again: same dedupe
// keys, only the messages finished since the given time, audited.
func TestReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	rcv := newSwitchable(t, "ok")
	d := destination("replay", rcv.URL, true)
	stop := e.run(t, d)
	e.send(t, "replay", "before", `{}`)
	e.waitState(t, "replay", "before", webhook.StateDelivered)
	var cut time.Time
	if err := e.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	rcv.mode.Store("refuse")
	e.send(t, "replay", "refused", `{}`)
	e.waitState(t, "replay", "refused", webhook.StateFailed)
	rcv.mode.Store("ok")
	e.send(t, "replay", "after", `{}`)
	e.waitState(t, "replay", "after", webhook.StateDelivered)
	stop()

	if _, err := webhook.Replay(ctx, e.pool, e.schema, webhook.Selection{Destination: "replay", State: webhook.StateUnknown}, "carol"); err == nil {
		t.Fatal("replay of unknown messages was accepted")
	}
	res, err := webhook.Replay(ctx, e.pool, e.schema, webhook.Selection{Destination: "replay", Since: cut}, "carol")
	if err != nil || res.Count != 1 {
		t.Fatalf("replay delivered since the cut: %+v %v", res, err)
	}
	res, err = webhook.Replay(ctx, e.pool, e.schema, webhook.Selection{Destination: "replay", State: webhook.StateFailed, Since: cut}, "carol")
	if err != nil || res.Count != 1 {
		t.Fatalf("replay failed since the cut: %+v %v", res, err)
	}
	e.run(t, d)
	e.waitState(t, "replay", "after", webhook.StateDelivered)
	e.waitState(t, "replay", "refused", webhook.StateDelivered)
	for key, want := range map[string]int{"before": 1, "refused": 2, "after": 2} {
		if got := rcv.count(key); got != want {
			t.Errorf("%s: %d requests, want %d", key, got, want)
		}
	}
	if got := strings.Join(e.auditActions(t), " "); got != "deliveries.replay:1 deliveries.replay:1" {
		t.Fatalf("audit_log: %s", got)
	}
}
