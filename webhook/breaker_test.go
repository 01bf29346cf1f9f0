package webhook_test

import (
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/webhook"
)

// TestCircuitBreaker: a receiver that keeps failing pauses its
// destination (a log line, a gauge); its messages wait, none failed,
// although each has only 3 attempts; the probe after the cool-down
// succeeds and every message is delivered.
func TestCircuitBreaker(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var down atomic.Bool
	down.Store(true)
	rcv := newScripted(t, func(w http.ResponseWriter) {
		if down.Load() {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(200)
	})
	d := destination("hook", rcv.URL, false)
	d.Retry5xx, d.MaxAttempts, d.Concurrency = true, 3, 1
	d.BreakerFailures, d.BreakerCooldown = 2, 300*time.Millisecond
	reg := prometheus.NewRegistry()
	var opened atomic.Bool
	log := slog.New(signalHandler{Handler: slog.DiscardHandler, sub: "destination paused", on: func() {
		opened.Store(true)
		down.Store(false) // the receiver recovers while the destination is paused
	}})
	s := e.sink(t, e.pool, d, webhook.Options{Logger: log, Metrics: webhook.NewMetrics(reg)})
	keys := []string{"a", "b", "c", "d", "e"}
	var events = make([]outboxEvent, 0, len(keys))
	for _, k := range keys {
		events = append(events, message(e.send(t, "hook", k, `{}`), "hook", k, `{}`))
	}
	writeAll(t, s, events)
	if !opened.Load() {
		t.Fatal("the destination was never paused")
	}
	for _, k := range keys {
		if got := e.delivery(t, "hook", k); got.State != webhook.StateDelivered {
			t.Errorf("%s: %s (%s) after %d attempts", k, got.State, got.LastError, got.Attempts)
		}
	}
}
