package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/inbox"
)

// The relay's retention job deletes final ledger rows older than
// --ledger-retention (default 30 days) and keeps every row still waiting
// for an operator or a relay; the inbox purges by age; a ledger window
// shorter than the outbox's retention is refused.
func TestLedgerRetention(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".deliveries (destination, dedupe_key, event_id, payload, state, reserved_at, finished_at) VALUES
		('d', 'old-delivered', 1, '{}', 'delivered', now() - interval '41 days', now() - interval '40 days'),
		('d', 'old-failed',    2, '{}', 'failed',    now() - interval '41 days', now() - interval '40 days'),
		('d', 'old-skipped',   3, '{}', 'skipped',   now() - interval '41 days', now() - interval '40 days'),
		('d', 'old-unknown',   4, '{}', 'unknown',   now() - interval '41 days', now() - interval '40 days'),
		('d', 'old-reserved',  5, '{}', 'reserved',  now() - interval '41 days', NULL),
		('d', 'new-delivered', 6, '{}', 'delivered', now() - interval '29 days', now() - interval '29 days');
		INSERT INTO "`+e.schema+`".inbox (source, key, received_at) VALUES ('s', 'old', now() - interval '40 days'), ('s', 'new', now())`); err != nil {
		t.Fatal(err)
	}

	_, _, f, err := parseRelayFlags(e.dbArgs)
	if err != nil {
		t.Fatal(err)
	}
	sched := jobs.New(jobs.Config{Pool: e.pool, Schema: e.schema, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := addJobs(sched, e.pool, nil, e.schema, f); err != nil {
		t.Fatal(err)
	}
	if err := sched.RunNow(ctx, "ledger-retention"); err != nil {
		t.Fatal(err)
	}
	rows, err := e.pool.Query(ctx, `SELECT dedupe_key FROM "`+e.schema+`".deliveries ORDER BY dedupe_key`)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, k)
	}
	if got := strings.Join(kept, " "); got != "new-delivered old-reserved old-unknown" {
		t.Errorf("ledger rows kept: %s (want new-delivered old-reserved old-unknown)", got)
	}

	n, err := inbox.Purge(ctx, e.pool, e.schema, 30*24*60*60*1e9)
	if err != nil || n != 1 {
		t.Errorf("inbox purge: %d deleted, %v (want 1)", n, err)
	}

	for _, args := range [][]string{{"--ledger-retention", "24h"}, {"--retention", "1000h", "--ledger-retention", "720h"}} {
		_, _, _, err := parseRelayFlags(append(args, e.dbArgs...))
		if err == nil || !strings.Contains(err.Error(), "ledger-retention") || !strings.Contains(err.Error(), "shorter than --retention") {
			t.Errorf("%v: want a refusal naming ledger-retention, got %v", args, err)
		}
	}
}
