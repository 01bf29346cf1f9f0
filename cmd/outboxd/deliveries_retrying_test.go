package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// A message past its in-line retries is parked as retrying with its next
// attempt time: operators see it in `deliveries list` and settle it with
// `deliveries resolve`, except while a retry of it is in flight on a
// relay that leads its destination.
func TestDeliveriesRetrying(t *testing.T) {
	e := cliSetup(t)
	ctx := context.Background()
	park := func(key string, inFlight bool) {
		t.Helper()
		id, err := e.outbox.AppendMessage(ctx, e.pool, outbox.Message{Destination: "d", DedupeKey: key, Payload: json.RawMessage(`{"n":1}`)})
		if err != nil {
			t.Fatal(err)
		}
		// As a sink leaves it after a 429 with a long Retry-After.
		if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".deliveries (destination, dedupe_key, event_id, payload, state, attempts, in_flight,
				last_status, last_error, next_attempt_at)
			VALUES ('d', $1, $2, '{"n":1}', 'retrying', 3, $3, 429, 'HTTP 429: slow down', now() + interval '10 minutes')`, key, id, inFlight); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := deliveries(ctx, append(args[:1:1], append(append([]string{}, e.dbArgs...), args[1:]...)...), &out)
		return out.String(), err
	}

	t.Run("list shows a parked message with its next attempt", func(t *testing.T) {
		park("p1", false)
		out, err := run("list", "--state", "retrying", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var ds []webhook.Delivery
		if err := json.Unmarshal([]byte(out), &ds); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if len(ds) != 1 || ds[0].DedupeKey != "p1" || ds[0].NextAttemptAt == nil || time.Until(*ds[0].NextAttemptAt) < 9*time.Minute {
			t.Fatalf("got %+v", ds)
		}
		table, err := run("list", "--destination", "d")
		if err != nil || !strings.Contains(table, "NEXT ATTEMPT") || !strings.Contains(table, ds[0].NextAttemptAt.UTC().Format("2006-01-02 15:04:05")) {
			t.Fatalf("the table lacks the next attempt (%v):\n%s", err, table)
		}
	})
	t.Run("resolve settles a parked message, and its retries end", func(t *testing.T) {
		out, err := run("resolve", "p1", "--destination", "d", "--failed", "--operator", "ops")
		if err != nil || !strings.Contains(out, "state now failed") {
			t.Fatalf("resolve --failed of a retrying row: %q, %v", out, err)
		}
		var next *time.Time
		if err := e.pool.QueryRow(ctx, `SELECT next_attempt_at FROM "`+e.schema+`".deliveries WHERE dedupe_key = 'p1'`).Scan(&next); err != nil || next != nil {
			t.Fatalf("next_attempt_at = %v (%v), want none once failed", next, err)
		}
	})
	t.Run("resolve --all settles every parked message of a destination", func(t *testing.T) {
		park("p2", false)
		park("p3", false)
		out, err := run("resolve", "--all", "--state", "retrying", "--destination", "d", "--failed", "--operator", "ops")
		if err != nil || !strings.Contains(out, "2 retrying messages for d resolved failed") {
			t.Fatalf("resolve --all --state retrying: %q, %v", out, err)
		}
	})
	t.Run("a parked message whose retry is in flight is left to the relay that leads its destination", func(t *testing.T) {
		park("p4", true)
		r, err := relay.New(relay.Config{Pool: e.pool, Schema: e.schema, LeaseInterval: 100 * time.Millisecond,
			Streams:    []relay.Stream{{Name: messageStream("d"), BucketHi: 1023, Indexes: []string{outbox.MessagePrefix + "d"}, Sink: holdSink{}}},
			Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		schematest.Eventually(t, 15*time.Second, "the relay leads the destination's stream", func() bool { return len(r.Leading()) == 1 })
		out, err := run("resolve", "p4", "--destination", "d", "--failed", "--operator", "ops")
		cancel()
		<-done
		if err == nil || !strings.Contains(err.Error(), "in flight") {
			t.Fatalf("resolve of a retrying row with a request in flight: %q, %v; want it refused", out, err)
		}
		// With no relay leading the stream, its sender is gone: settle it.
		schematest.Eventually(t, 15*time.Second, "no relay leads the destination's stream", func() bool {
			leaders, err := relay.Leaders(ctx, e.pool, e.schema, []string{messageStream("d")})
			return err == nil && len(leaders) == 1 && leaders[0].PID == 0
		})
		if out, err := run("resolve", "p4", "--destination", "d", "--delivered", "--operator", "ops"); err != nil || !strings.Contains(out, "state now delivered") {
			t.Fatalf("resolve of an abandoned retrying row: %q, %v", out, err)
		}
	})
}
