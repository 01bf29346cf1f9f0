package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// The real `outboxd relay` with --destination flags next to the search
// stream, then `outboxd deliveries` on what it left.
func TestDeliveriesCommand(t *testing.T) {
	// Not parallel: it sets the environment and the default logger.
	e := cliSetup(t)
	ctx := context.Background()
	esURL := schematest.ElasticsearchURL(t)
	index := schematest.Name("wh-")
	t.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", esURL+"/"+index+"-000001,"+index+"?ignore_unavailable=true", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	const secretValue = "whsec_c2VjcmV0LXRoYXQtbXVzdC1uZXZlci1sZWFr"
	key, _ := webhook.ParseSecret(secretValue)
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if webhook.Verify(key, r.Header, body, time.Now(), 0) != nil {
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	defer fast.Close()
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { time.Sleep(time.Second) }))
	defer func() { hanging.CloseClientConnections(); hanging.Close() }()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String() + "/"
	l.Close()

	addr := freeAddr(t)
	t.Setenv("ELASTICSEARCH_URL", esURL)
	t.Setenv("HOOK_SECRET", secretValue)
	logs := &syncBuffer{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })

	relayCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- runRelay(relayCtx, append([]string{"--schema", e.schema, "--admin-addr", addr, "--lease-interval", "100ms", "--max-poll", "20ms",
			"--destination", "fast=" + fast.URL + ",secret_env=HOOK_SECRET",
			"--destination", "slow=" + hanging.URL + ",secret_env=HOOK_SECRET,timeout=200ms,concurrency=2",
			"--destination", "down=" + down + ",secret_env=HOOK_SECRET,rate=5/s"}, e.dbArgs[:2]...))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()

	for i := range 5 {
		if _, err := e.outbox.AppendMessage(ctx, e.pool, outbox.Message{Destination: "down", DedupeKey: fmt.Sprint("d", i), Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []outbox.Message{
		{Destination: "slow", DedupeKey: "order-7-shipped", Payload: json.RawMessage(`{"order":7}`)},
		{Destination: "fast", DedupeKey: "order-8-paid", Payload: json.RawMessage(`{"order":8}`)},
		{Destination: "nowhere", DedupeKey: "lost", Payload: json.RawMessage(`{}`)},
	} {
		if _, err := e.outbox.AppendMessage(ctx, e.pool, m); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	e.append(t, index, "doc-1", `{"title":"hello"}`)

	scrape := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	schematest.Eventually(t, 30*time.Second, "the search event is applied while a destination is down", func() bool {
		return strings.Contains(scrape(), `outboxd_events_total{index="`+index+`",outcome="applied",stream="default"} 1`)
	})
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("the search stream took %s", took)
	}
	var body string
	schematest.Eventually(t, 30*time.Second, "/metrics shows the ledger", func() bool {
		body = scrape()
		return strings.Contains(body, `outboxd_messages_total{destination="fast",state="delivered"} 1`) &&
			strings.Contains(body, `outboxd_messages_total{destination="slow",state="unknown"} 1`) &&
			strings.Contains(body, `outboxd_messages_total{destination="nowhere",state="waiting"} 1`) &&
			strings.Contains(body, `outboxd_webhook_waiting{destination="nowhere"} 1`) &&
			strings.Contains(body, `outboxd_messages_unknown 1`) &&
			strings.Contains(body, `outboxd_messages_oldest_reserved_seconds{destination="down"}`)
	})

	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := deliveries(ctx, append(args[:1:1], append(append([]string{}, e.dbArgs...), args[1:]...)...), &out)
		return out.String(), err
	}
	t.Run("list --state unknown shows the message whose outcome is unknown", func(t *testing.T) {
		out, err := run("list", "--state", "unknown", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var ds []webhook.Delivery
		if err := json.Unmarshal([]byte(out), &ds); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if len(ds) != 1 || ds[0].DedupeKey != "order-7-shipped" || ds[0].Destination != "slow" {
			t.Fatalf("got %+v", ds)
		}
		table, err := run("list", "--destination", "nowhere")
		if err != nil || !strings.Contains(table, `no live relay serves destination "nowhere"`) || !strings.Contains(table, "waiting") {
			t.Fatalf("the table lacks the reason (%v):\n%s", err, table)
		}
	})
	t.Run("resolve records the operator's decision in the ledger and audit_log", func(t *testing.T) {
		out, err := run("resolve", "order-7-shipped", "--destination", "slow", "--delivered", "--operator", "bob")
		if err != nil || !strings.Contains(out, "state now delivered") {
			t.Fatalf("%v: %s", err, out)
		}
		var action string
		if err := e.pool.QueryRow(ctx, `SELECT action FROM "`+e.schema+`".audit_log WHERE operator = 'bob'`).Scan(&action); err != nil || action != "deliveries.delivered" {
			t.Fatalf("audit: %q %v", action, err)
		}
		if _, err := run("resolve", "order-7-shipped", "--destination", "slow", "--retry", "--operator", "bob"); err == nil {
			t.Fatal("a delivered message was resolved again")
		}
		if _, err := run("resolve", "order-8-paid", "--destination", "fast", "--operator", "bob"); err == nil || !strings.Contains(err.Error(), "exactly one of") {
			t.Fatalf("want the missing resolution named, got %v", err)
		}
	})
	t.Run("a bad destination flag names the field and the reason", func(t *testing.T) {
		err := runRelay(ctx, append([]string{"--schema", e.schema, "--admin-addr", "", "--destination", "x=" + fast.URL + ",secret_env=NOT_SET_ANYWHERE"}, e.dbArgs[:2]...))
		if err == nil || !strings.Contains(err.Error(), "secret_env: environment variable NOT_SET_ANYWHERE is not set") {
			t.Fatalf("got %v", err)
		}
	})
	if strings.Contains(logs.String(), secretValue) || strings.Contains(logs.String(), "c2VjcmV0") {
		t.Errorf("the logs contain the destination secret:\n%s", logs.String())
	}
}
