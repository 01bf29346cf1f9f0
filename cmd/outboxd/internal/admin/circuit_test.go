package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// TestAdminCircuitOpen: a destination its breaker paused shows on the
// page's webhook row as "circuit open since HH:MM:SS", from the sink's own
// gauges, and no longer once the probe succeeded and it resumed.
func TestAdminCircuitOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	var down atomic.Bool
	down.Store(true)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer rcv.Close()
	e.reg.MustRegister(webhook.NewLedgerCollector(e.pool, `"`+e.schema+`"`))
	sink, err := webhook.NewSink(webhook.Options{Pool: e.pool, Schema: e.schema, Metrics: webhook.NewMetrics(e.reg), Logger: e.quiet,
		Destination: webhook.Destination{Name: "billing", URL: rcv.URL, Secret: []byte("test-secret-0123456789"),
			Retry5xx: true, Concurrency: 1, MaxAttempts: 1000, Timeout: 2 * time.Second, RetryInline: time.Minute,
			BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
			BreakerFailures: 1, BreakerCooldown: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	e.startAdmin(t, admin.Config{})
	id, err := e.outbox.AppendMessage(ctx, e.pool, outbox.Message{Destination: "billing", DedupeKey: "k", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	before := float64(time.Now().Unix())
	done := make(chan error, 1)
	go func() {
		_, err := sink.Write(ctx, []outbox.Event{{ID: id, IndexName: outbox.MessageIndex("billing"), SourceID: "k", Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)}})
		done <- err
	}()
	billing := func() admin.MessageView {
		code, body, _ := e.get(t, "/api/summary")
		var s admin.Summary
		if code != 200 || json.Unmarshal([]byte(body), &s) != nil {
			t.Fatalf("/api/summary: %d %s", code, body)
		}
		for _, m := range s.Messages {
			if m.Destination == "billing" {
				return m
			}
		}
		return admin.MessageView{}
	}
	var open admin.MessageView
	schematest.Eventually(t, 20*time.Second, "the summary shows billing's circuit open", func() bool {
		open = billing()
		return open.CircuitOpen
	})
	if open.CircuitOpenSince < before || open.CircuitOpenSince > float64(time.Now().Unix()+1) {
		t.Errorf("circuit_open_since = %v, want the time it opened (after %v)", open.CircuitOpenSince, before)
	}

	t.Run("the page's webhook row says since when the circuit is open", func(t *testing.T) {
		dom := headless(t, chromium(t), e.base+"/", "--dump-dom")
		row := regexp.MustCompile(`(?s)<tr data-destination="billing">.*?</tr>`).FindString(dom)
		tag := regexp.MustCompile(`data-metric="circuit_open"[^>]*>([^<]*)</span>`).FindStringSubmatch(row)
		if tag == nil || !regexp.MustCompile(`^circuit open since \d\d:\d\d:\d\d \(`).MatchString(tag[1]) {
			t.Fatalf("billing's row has no \"circuit open since HH:MM:SS\": %s", row)
		}
	})

	down.Store(false) // the next probe succeeds
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m := billing(); m.CircuitOpen || m.CircuitOpenSince != 0 || m.Delivered != 1 {
		t.Fatalf("after the probe succeeded: %+v, want the circuit closed and the message delivered", m)
	}
	dom := headless(t, chromium(t), e.base+"/", "--dump-dom")
	if row := regexp.MustCompile(`(?s)<tr data-destination="billing">.*?</tr>`).FindString(dom); row == "" || strings.Contains(row, "circuit_open") {
		t.Fatalf("billing's row once resumed: %q", row)
	}
}
