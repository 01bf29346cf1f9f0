package backfill

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
)

// opts are the options of a backfill of e's table into e's index.
func opts(e *tooltest.Source, sink *indexer.Sink) Options {
	return Options{Pool: e.Pool, Schema: e.Schema, Sink: sink, Index: e.Name, SourceSQL: e.SQL(), Batch: 2000}
}

func TestBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a backfill interrupted midway and run again, with writers updating and deleting and the relay delivering, ends equal to the table", func(t *testing.T) {
		t.Parallel()
		const rows = 100_000
		e := tooltest.NewSource(t, rows)
		stopRelay := e.StartRelay(t)
		wr := e.StartWriters(t, 4, rows)

		// First run: cancelled from inside, right after its 15th batch is
		// stored.
		sink := tooltest.NewSink(t, indexer.Options{Client: e.ES})
		bctx, cancel := context.WithCancel(ctx)
		o := opts(e, sink)
		o.afterStore = func(batches int) {
			if batches == 15 {
				cancel()
			}
		}
		first, err := Run(bctx, o)
		cancel()
		if !errors.Is(err, context.Canceled) || first.Rows != 15*2000 {
			t.Fatalf("first run: %+v, %v; want it cancelled after 15 batches of 2000 rows", first, err)
		}
		second, err := Run(ctx, opts(e, sink))
		if err != nil {
			t.Fatal(err)
		}
		if second.From == "" || second.Rows >= rows-first.Rows+int64(4*2000) {
			t.Fatalf("second run did not continue after the stored key: first %+v, second %+v", first, second)
		}
		updates, deletes := wr.Stop(t)
		t.Logf("backfill: first run %d rows, second %d rows after %q (%d applied, %d stale); writers: %d updates, %d deletes",
			first.Rows, second.Rows, second.From, second.Applied, second.Stale, updates, deletes)
		e.WaitBacklog(t)
		stopRelay()
		e.AssertProjection(t)
	})

	t.Run("a row older than the index holds is stale, a deleted document stays deleted, a bad row is reported and the rest arrive", func(t *testing.T) {
		t.Parallel()
		e := tooltest.NewSource(t, 3) // a0000001..a0000003 at version 1
		sink := tooltest.NewSink(t, indexer.Options{Client: e.ES})
		estest.MustWrite(t, sink, estest.Upsert(e.Name, "a0000001", 5, `{"title":"newer"}`), estest.Delete(e.Name, "a0000002", 3))
		if _, err := e.Pool.Exec(ctx, `INSERT INTO `+e.Table+` VALUES ('bad', 1, 'x')`); err != nil {
			t.Fatal(err)
		}
		o := opts(e, sink)
		o.SourceSQL = `SELECT id, version, CASE WHEN id = 'bad' THEN '[1]'::json ELSE ` + tooltest.DocSQL + ` END FROM ` + e.Table
		rep, err := Run(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Rows != 4 || rep.Applied != 1 || rep.Stale != 2 || rep.Rejected != 1 || len(rep.Samples) != 1 ||
			rep.Samples[0].ID != "bad" || !strings.Contains(rep.Samples[0].Reason, "document") {
			t.Fatalf("report %+v", rep)
		}
		docs := estest.SearchRead(t, e.ES, e.Name)
		if len(docs) != 2 || !strings.Contains(string(docs["a0000001"]), "newer") || docs["a0000003"] == nil {
			t.Fatalf("visible: %v", docs)
		}
	})

	t.Run("an unfinished backfill is continued only with the same query; restart starts over", func(t *testing.T) {
		t.Parallel()
		e := tooltest.NewSource(t, 10)
		if _, err := e.Pool.Exec(ctx, `INSERT INTO "`+e.Schema+`".backfills (index_name, source_hash, last_key) VALUES ($1, 'other', 'a0000005')`, e.Name); err != nil {
			t.Fatal(err)
		}
		o := opts(e, tooltest.NewSink(t, indexer.Options{Client: e.ES}))
		if _, err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "another source_sql") {
			t.Fatalf("got %v", err)
		}
		o.Restart = true
		rep, err := Run(ctx, o)
		if err != nil || rep.Rows != 10 || rep.From != "" {
			t.Fatalf("restart: %+v, %v", rep, err)
		}
		o.Restart = false
		rep, err = Run(ctx, o) // finished: a new run starts from the beginning
		if err != nil || rep.Rows != 10 || rep.Stale != 10 {
			t.Fatalf("again: %+v, %v", rep, err)
		}
	})

	t.Run("a query that tries to write is refused by the read-only transaction", func(t *testing.T) {
		t.Parallel()
		e := tooltest.NewSource(t, 2)
		o := opts(e, tooltest.NewSink(t, indexer.Options{Client: e.ES}))
		wipe := `"` + e.Schema + `".wipe()`
		if _, err := e.Pool.Exec(ctx, `CREATE FUNCTION `+wipe+` RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN DELETE FROM `+e.Table+`; RETURN 1; END $$`); err != nil {
			t.Fatal(err)
		}
		o.SourceSQL = `SELECT id, version, ` + tooltest.DocSQL + ` FROM ` + e.Table + `, (SELECT ` + wipe + `) w`
		if _, err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "read-only") {
			t.Fatalf("got %v", err)
		}
		var n int
		if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM `+e.Table).Scan(&n); err != nil || n != 2 {
			t.Fatalf("rows left: %d, %v", n, err)
		}
	})
}
