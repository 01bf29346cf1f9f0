package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// `deliveries resolve --all` and `deliveries replay`: refused without
// their selection, audited with a count, warning of second effects.
func TestDeliveriesBulkCommands(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	ctx := context.Background()
	closed := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-closed:
		}
	}))
	defer func() { close(closed); hang.CloseClientConnections(); hang.Close() }()
	sink, err := webhook.NewSink(webhook.Options{Pool: e.pool, Schema: e.schema, Destination: webhook.Destination{
		Name: "bulk", URL: hang.URL, Secret: []byte("s3cret"), Timeout: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Config{Pool: e.pool, Schema: e.schema, LeaseInterval: 100 * time.Millisecond, MaxPollInterval: 20 * time.Millisecond,
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
		Streams: []relay.Stream{{Name: "webhook-bulk", BucketHi: 1023, Indexes: []string{outbox.MessageIndex("bulk")}, Sink: sink}}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	for i := range 3 {
		if _, err := e.outbox.AppendMessage(ctx, e.pool, outbox.Message{Destination: "bulk", DedupeKey: fmt.Sprint("k", i), Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	schematest.Eventually(t, 20*time.Second, "three unknown messages", func() bool {
		var n int
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".deliveries WHERE state = 'unknown'`).Scan(&n)
		return n == 3
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := deliveries(ctx, append(args[:1:1], append(append([]string{}, e.dbArgs...), args[1:]...)...), &out)
		return out.String(), err
	}
	for args, want := range map[string]string{
		"resolve --state unknown --destination bulk --failed":          "--all",
		"resolve --all --destination bulk --failed":                    "--state",
		"resolve --all --state unknown --failed":                       "--destination",
		"resolve k0 --all --state unknown --destination bulk --failed": "not both",
		"replay --destination bulk":                                    "since",
		"replay --since 1h":                                            "destination",
		"replay --destination bulk --since yesterday":                  "since",
	} {
		if _, err := run(strings.Fields(args)...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: want an error naming %s, got %v", args, want, err)
		}
	}
	out, err := run("resolve", "--all", "--state", "unknown", "--destination", "bulk", "--since", "1h", "--failed", "--operator", "op")
	if err != nil || !strings.Contains(out, "3 unknown messages for bulk resolved failed by op") {
		t.Fatalf("%v: %s", err, out)
	}
	out, err = run("resolve", "--all", "--state", "failed", "--destination", "bulk", "--retry", "--operator", "op", "--json")
	var res webhook.BulkResult
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Count != 3 || len(res.Warnings) != 3 {
		t.Fatalf("retry of three once-unknown messages: %v: %s", err, out)
	}
	if out, err = run("replay", "--destination", "bulk", "--since", "1h", "--operator", "op"); err != nil || !strings.Contains(out, "0 delivered messages for bulk replayed by op") {
		t.Fatalf("%v: %s", err, out)
	}
	var audited string
	if err := e.pool.QueryRow(ctx, `SELECT string_agg(action || ':' || (detail->>'count'), ' ' ORDER BY id) FROM "`+e.schema+`".audit_log`).Scan(&audited); err != nil ||
		audited != "deliveries.resolve_all:3 deliveries.resolve_all:3 deliveries.replay:0" {
		t.Fatalf("audit_log: %q %v", audited, err)
	}
}
