package main

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// Every scheduled job firing at once, each holding its lock connection and
// wanting more, must not stop delivery: with the relay's own pool at
// pgxpool's default of 4 connections, the jobs used to be able to take all
// of them while the stream reader waited.
func TestRelayDeliversWhileEveryJobRuns(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	ctx := context.Background()
	esURL := schematest.ElasticsearchURL(t)
	index := schematest.Name("jobs-")
	ref := index + "-ref"
	t.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", esURL+"/"+index+"-000001,"+index+","+ref+"-000001,"+ref+"?ignore_unavailable=true", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	dbURL := schematest.DatabaseURL(t)
	appendN := func(idx, prefix string, n int) {
		for from := 0; from < n; from += 1000 {
			batch := make([]outbox.Event, 0, 1000)
			for i := from; i < min(from+1000, n); i++ {
				batch = append(batch, outbox.Event{IndexName: idx, SourceID: prefix + strconv.Itoa(i), Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(`{"n":1}`)})
			}
			if _, err := e.outbox.AppendBatch(ctx, e.pool, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	acked := func() int64 {
		var n int64
		_ = e.pool.QueryRow(ctx, `SELECT coalesce(sum(acked_events), 0) FROM "`+e.schema+`".progress`).Scan(&n)
		return n
	}

	// Two jobs wait on row locks an application transaction holds (the
	// retention on acknowledged events, the dead-letter retry on a parked
	// dead letter), each with its lock and its work connection; the
	// reconcile checks another index against a slow source query (about
	// 3s) that finds most of it missing, so it holds its lock, the source
	// query and a fix transaction at once, as on a big table.
	appendN(ref, "r", 100)
	if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".dead_letters (event_id, stream, index_name, source_id, version, op, document,
		occurred_at, reason, attempts, first_failed_at, last_failed_at)
		VALUES (1, 'default', $1, 'dl', 1, 'upsert', '{"n":1}', now(), 'gave up after 10 attempts: timeout', 10, now(), now())`, ref); err != nil {
		t.Fatal(err)
	}
	app, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Rollback(ctx)
	for _, table := range []string{"events", "dead_letters"} {
		if _, err := app.Exec(ctx, `SELECT 1 FROM "`+e.schema+`".`+table+` FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
	}
	cmd, out := startCommand(t, []string{"relay",
		"--database-url", withParam(dbURL, "pool_max_conns=4"), "--schema", e.schema, "--elasticsearch-url", esURL,
		"--admin-addr", "", "--lease-interval", "100ms",
		"--retention", "0s", "--retention-schedule", "@every 1s",
		// The purge visits every managed index on the shared node: a
		// horizon of ten years leaves other tests' tombstones alone.
		"--tombstone-purge-schedule", "@every 1s", "--tombstone-horizon", "87600h",
		"--deadletter-retry-schedule", "@every 1s",
		"--reconcile-schedule", "@every 1s", "--reconcile-apply", "--reconcile-index", ref,
		"--reconcile-sql", `SELECT 'r' || i, 1::bigint, '{"n":1}'::jsonb FROM generate_series(0, 2999) i WHERE pg_sleep(0.001) IS NOT NULL`,
	}...)
	time.Sleep(2500 * time.Millisecond) // every job has fired, two are stuck

	const n = 10000
	start := time.Now()
	base := acked()
	appendN(index, "e", n)
	deadline := start.Add(60 * time.Second)
	// Every one of them acknowledged: none left in the backlog (the fix
	// events the reconcile appends are acknowledged too, so the count
	// alone would not do).
	for acked()-base < n || e.backlog(t) > 0 {
		if cmd.ProcessState != nil {
			t.Fatalf("the relay exited:\n%s", out.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d events delivered after %v while the jobs ran\n%s", acked()-base, n, time.Since(start).Round(time.Second), out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d events delivered in %v with every job scheduled every second, two of them stuck", n, time.Since(start).Round(100*time.Millisecond))
	if err := app.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	jobs := []string{"deadletter-retry", "ledger-retention", "outbox-retention", "reconcile", "tombstone-purge"}
	var ran []string
	schematest.Eventually(t, 30*time.Second, "every job has run (the reconcile takes a few seconds)", func() bool {
		ran = nil
		_ = e.pool.QueryRow(ctx, `SELECT coalesce(array_agg(job ORDER BY job), '{}') FROM "`+e.schema+`".job_runs WHERE runs > 0`).Scan(&ran)
		if !slices.Equal(ran, jobs) {
			t.Logf("jobs run: %v", ran)
		}
		return slices.Equal(ran, jobs)
	})
}
