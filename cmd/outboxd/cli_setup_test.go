package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/relay/relaytest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// cliSink rejects documents carrying "bad": true and applies the rest.
type cliSink struct {
	mu      sync.Mutex
	applied map[string]int
}

func (s *cliSink) Write(_ context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	outs := make([]outbox.Outcome, len(events))
	for i, e := range events {
		var doc struct{ Bad bool }
		_ = json.Unmarshal(e.Document, &doc)
		if doc.Bad {
			outs[i] = outbox.Outcome{Status: outbox.Rejected, Reason: "mapper_parsing_exception: failed to parse [price]"}
			continue
		}
		s.applied[e.SourceID]++
		outs[i] = outbox.Outcome{Status: outbox.Applied}
	}
	return outs, nil
}

type cliEnv struct {
	pool   *pgxpool.Pool
	schema string
	outbox *outbox.Outbox
	sink   *cliSink
	dbArgs []string
}

func cliSetup(t *testing.T) *cliEnv {
	t.Helper()
	pool, name := schematest.Setup(t)
	ob, err := outbox.NewOutbox(name)
	if err != nil {
		t.Fatal(err)
	}
	return &cliEnv{pool: pool, schema: name, outbox: ob, sink: &cliSink{applied: map[string]int{}},
		dbArgs: []string{"--database-url", schematest.DatabaseURL(t), "--schema", name}}
}

// runRelay runs a relay until the returned stop is called (or the test ends).
func (e *cliEnv) runRelay(t *testing.T) (stop func()) {
	t.Helper()
	r, err := relay.New(relay.Config{Pool: e.pool, Schema: e.schema, Sink: e.sink, LeaseInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop = relaytest.Run(t, r)
	schematest.Eventually(t, 20*time.Second, "the relay leads", func() bool { return len(r.Leading()) == 1 })
	return stop
}

func (e *cliEnv) append(t *testing.T, index, source, doc string) {
	t.Helper()
	if _, err := e.outbox.Append(context.Background(), e.pool, outbox.Event{IndexName: index, SourceID: source, Op: outbox.OpUpsert, Document: json.RawMessage(doc)}); err != nil {
		t.Fatal(err)
	}
}

func (e *cliEnv) backlog(t *testing.T) int64 {
	t.Helper()
	st, err := relay.CollectStats(context.Background(), e.pool, e.schema)
	if err != nil {
		t.Fatal(err)
	}
	return st.Backlog()
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exitError); ok {
		return ee.code
	}
	return 1
}

// withParam appends a query parameter (key=value) to a PostgreSQL URL.
func withParam(url, param string) string {
	if strings.Contains(url, "?") {
		return url + "&" + param
	}
	return url + "?" + param
}
