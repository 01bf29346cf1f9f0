package main

import (
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

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// The page reports webhook outcomes by ledger state only: the per-index
// table and the outcome totals hold the search indexes, not the message
// indexes the unrouted stream passes through (every routed message would
// count as stale) or whose sink answers applied for failed messages too.
func TestPageReportsMessagesByLedgerStateOnly(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.HasPrefix(r.Header.Get("Idempotency-Key"), "bad") {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	defer rcv.Close()
	fr := startFleetRelay(t, e, hookSpec("hook", rcv.URL))
	for i := range 7 {
		e.message(t, "hook", fmt.Sprint("good", i))
	}
	for i := range 3 {
		e.message(t, "hook", fmt.Sprint("bad", i))
	}
	for i := range 4 {
		e.append(t, "search-docs", fmt.Sprint("doc", i), `{}`)
	}
	schematest.Eventually(t, 20*time.Second, "every message is final and every search event applied", func() bool {
		st := e.ledgerStates(t, "hook")
		e.sink.mu.Lock()
		defer e.sink.mu.Unlock()
		return st["delivered"] == 7 && st["failed"] == 3 && len(e.sink.applied) == 4
	})
	srv, err := admin.New(admin.Config{Addr: "127.0.0.1:0", Gatherer: fr.reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Stats: func(ctx context.Context) (*relay.Stats, error) { return relay.CollectStats(ctx, e.pool, e.schema) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var s admin.Summary
	schematest.Eventually(t, 10*time.Second, "the summary answers", func() bool {
		resp, err := http.Get("http://" + srv.Addr() + "/api/summary")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&s) == nil
	})
	if len(s.Indexes) != 1 || s.Indexes[0].Index != "search-docs" || s.Indexes[0].Applied != 4 {
		t.Errorf("per-index table: %+v (want only search-docs, 4 applied)", s.Indexes)
	}
	if s.Outcomes["applied"] != 4 || s.Outcomes["stale"] != 0 {
		t.Errorf("outcomes: %v (want 4 applied, 0 stale)", s.Outcomes)
	}
	if len(s.Messages) != 1 || s.Messages[0].Destination != "hook" || s.Messages[0].Delivered != 7 || s.Messages[0].Failed != 3 {
		t.Errorf("messages: %+v (want hook: 7 delivered, 3 failed)", s.Messages)
	}
}
