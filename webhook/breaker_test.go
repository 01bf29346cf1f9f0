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
// destination (a log line, outboxd_webhook_circuit_open 1 and the time it
// opened, both 0 again once it resumes); its messages wait, none failed,
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
	var gaugeOpen, openedAt atomic.Value // what /metrics says while the destination is paused
	log := slog.New(signalHandler{Handler: slog.DiscardHandler, sub: "destination paused", on: func() {
		opened.Store(true)
		v, _, _ := gather(reg, "outboxd_webhook_circuit_open", "destination", "hook")
		gaugeOpen.Store(v)
		v, _, _ = gather(reg, "outboxd_webhook_circuit_opened_timestamp_seconds", "destination", "hook")
		openedAt.Store(v)
		down.Store(false) // the receiver recovers while the destination is paused
	}})
	before := float64(time.Now().Unix())
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
	if v := gaugeOpen.Load(); v != 1.0 {
		t.Errorf("outboxd_webhook_circuit_open = %v while the destination was paused, want 1", v)
	}
	if v, _ := openedAt.Load().(float64); v < before || v > float64(time.Now().Unix()+1) {
		t.Errorf("outboxd_webhook_circuit_opened_timestamp_seconds = %v while paused, want the time it opened (after %v)", v, before)
	}
	for name, want := range map[string]float64{"outboxd_webhook_circuit_open": 0, "outboxd_webhook_circuit_opened_timestamp_seconds": 0} {
		if v, ok := series(t, reg, name, "destination", "hook"); !ok || v != want {
			t.Errorf("%s = %v (present: %v) after the destination resumed, want %v", name, v, ok, want)
		}
	}
	for _, k := range keys {
		if got := e.delivery(t, "hook", k); got.State != webhook.StateDelivered {
			t.Errorf("%s: %s (%s) after %d attempts", k, got.State, got.LastError, got.Attempts)
		}
	}
}
