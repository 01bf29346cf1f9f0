package rebuild

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
)

func TestRebuild(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, from := range []string{"index", "source"} {
		t.Run("a rebuild from the "+from+" killed during the copy and during the catch-up, run again while 8 writers change rows, the relay is SIGKILLed once and a searcher polls the name, swaps to the new mapping without losing a write", func(t *testing.T) {
			t.Parallel()
			proveRebuild(t, from)
		})
	}

	t.Run("documents the new mapping refuses are reported and stop the swap until accepted", func(t *testing.T) {
		t.Parallel()
		e := setupRebuild(t, 5)
		estest.MustWrite(t, tooltest.NewSink(t, indexer.Options{Client: e.ES}), estest.Upsert(e.Name, "odd", 1, `{"title":"x","n":"not a number"}`), estest.Upsert(e.Name, "even", 1, `{"title":"y","n":"2"}`))
		o := rebuildOpts(e)
		o.Mappings = []byte(`{"mappings":{"properties":{"n":{"type":"long"}}}}`)
		rep, err := Run(ctx, o)
		var re *RejectedError
		if !errors.As(err, &re) || re.Rejected != 1 || len(rep.Samples) != 1 || rep.Samples[0].ID != "odd" || rep.Swapped {
			t.Fatalf("first run: %+v, %v", rep, err)
		}
		if got := aliasTarget(t, e.ES, e.Name); got != indexer.FirstIndex(e.Name) {
			t.Fatalf("%s points at %s after a refused rebuild", e.Name, got)
		}
		o.AcceptRejected = true
		rep, err = Run(ctx, o)
		if err != nil || !rep.Swapped || rep.Rejected != 1 {
			t.Fatalf("accepted: %+v, %v", rep, err)
		}
		docs := estest.SearchRead(t, e.ES, e.Name)
		if len(docs) != 6 || docs["odd"] != nil {
			t.Fatalf("visible after the swap: %d documents, odd %s", len(docs), docs["odd"])
		}
	})

	t.Run("abort removes the half-built index and a new rebuild starts over; a kept old index blocks the next rebuild until dropped", func(t *testing.T) {
		t.Parallel()
		e := setupRebuild(t, 3000)
		o := rebuildOpts(e)
		o.Batch = 100
		_, unlock, err := openStore(ctx, e.Pool, e.Schema, e.Name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "another rebuild") {
			t.Fatalf("a second rebuild at once: %v", err)
		}
		unlock()
		_, err = Run(cancelWhen(func() bool {
			var n int64
			_ = e.Pool.QueryRow(ctx, `SELECT coalesce(max(copied), 0) FROM "`+e.Schema+`".rebuilds`).Scan(&n)
			return n >= 500
		}), o)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("first run: %v", err)
		}
		o.Mappings = nil
		if _, err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "other mappings") {
			t.Fatalf("rerun with other options: %v", err)
		}
		gone, err := Abort(ctx, e.Pool, e.Schema, e.ES, e.Name)
		if err != nil || gone != e.Name+"-000002" {
			t.Fatalf("abort: %q, %v", gone, err)
		}
		if ok, _ := indexExists(ctx, e.ES, gone); ok {
			t.Fatalf("%s still exists after abort", gone)
		}
		if p, _ := phase(t, e); p != PhaseAborted {
			t.Fatalf("phase after abort: %s", p)
		}
		if _, err := Abort(ctx, e.Pool, e.Schema, e.ES, e.Name); err == nil {
			t.Fatal("a second abort found something to abort")
		}

		// Without mappings the new index keeps the old one's.
		o.Keep = time.Hour
		rep, err := Run(ctx, o)
		if err != nil || !rep.Swapped || rep.NewIndex != e.Name+"-000002" || rep.Copied != 3000 {
			t.Fatalf("rebuild after abort: %+v, %v", rep, err)
		}
		if st, b := estest.Call(t, e.ES, "GET", "/"+rep.NewIndex+"/_mapping/field/title", ""); st != 200 || !strings.Contains(string(b), `"type":"keyword"`) {
			t.Fatalf("mapping of title: %d %s", st, b)
		}
		if _, err := Abort(ctx, e.Pool, e.Schema, e.ES, e.Name); err == nil {
			t.Fatal("abort after the swap succeeded")
		}
		if _, err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "kept until") {
			t.Fatalf("rebuild while the old index is kept: %v", err)
		}
		// Its time passed: the next rebuild drops it and goes on.
		if _, err := e.Pool.Exec(ctx, `UPDATE "`+e.Schema+`".rebuilds SET keep_until = now() - interval '1 second'`); err != nil {
			t.Fatal(err)
		}
		rep, err = Run(ctx, o)
		if err != nil || len(rep.DroppedOld) != 1 || rep.DroppedOld[0] != indexer.FirstIndex(e.Name) || rep.NewIndex != e.Name+"-000003" {
			t.Fatalf("rebuild after the keep time: %+v, %v", rep, err)
		}
		if ok, _ := indexExists(ctx, e.ES, indexer.FirstIndex(e.Name)); ok {
			t.Fatal("the expired old index still exists")
		}
		if docs := estest.SearchRead(t, e.ES, e.Name); len(docs) != 3000 {
			t.Fatalf("%d documents visible", len(docs))
		}
	})

	t.Run("from the source, rows come from the query and the index's tombstones keep deleted documents deleted", func(t *testing.T) {
		t.Parallel()
		e := setupRebuild(t, 4)
		// a0000002 was deleted at version 3 but the query still returns it
		// at version 1; the query says a0000003 is deleted.
		estest.MustWrite(t, tooltest.NewSink(t, indexer.Options{Client: e.ES}), estest.Delete(e.Name, "a0000002", 3))
		o := rebuildOpts(e)
		o.From, o.SourceSQL = "source", `SELECT id, version, json_build_object('id', id, 'title', 'from source ' || title), id = 'a0000003' FROM `+e.Table
		rep, err := Run(ctx, o)
		if err != nil || !rep.Swapped {
			t.Fatalf("rebuild: %+v, %v", rep, err)
		}
		docs := estest.SearchRead(t, e.ES, e.Name)
		if len(docs) != 2 || docs["a0000002"] != nil || docs["a0000003"] != nil || !strings.Contains(string(docs["a0000001"]), "from source") {
			t.Fatalf("visible: %v", docs)
		}
		if d := estest.Get(t, e.ES, indexer.WriteAlias(e.Name), "a0000002"); !estest.IsTombstone(d.Source) || d.Version != 3 {
			t.Fatalf("a0000002 in the new index: %+v", d)
		}
	})

	t.Run("writes that reach the old index after the swap are copied by the final catch-up, and later ones are refused", func(t *testing.T) {
		t.Parallel()
		e := setupRebuild(t, 10)
		old := indexer.FirstIndex(e.Name)
		o := rebuildOpts(e)
		o.Grace = 2 * time.Second
		// A bulk request that resolved N-write just before the swap lands
		// in the old index just after it.
		late := make(chan int, 1)
		go func() {
			deadline := time.Now().Add(time.Minute)
			for time.Now().Before(deadline) {
				var p string
				_ = e.Pool.QueryRow(ctx, `SELECT phase FROM "`+e.Schema+`".rebuilds`).Scan(&p)
				if p == PhaseSwapped {
					st, _ := estest.Call(t, e.ES, "PUT", "/"+old+"/_doc/a0000001?version=50&version_type=external", `{"title":"late"}`)
					late <- st
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			late <- 0
		}()
		rep, err := Run(ctx, o)
		if err != nil || !rep.Swapped {
			t.Fatalf("rebuild: %+v, %v", rep, err)
		}
		if st := <-late; st != 201 && st != 200 {
			t.Fatalf("the late write: HTTP %d", st)
		}
		if d := estest.Get(t, e.ES, e.Name, "a0000001"); d.Version != 50 || !strings.Contains(string(d.Source), "late") {
			t.Fatalf("after the final catch-up: %+v", d)
		}
		// Later still: the old index refuses writes (the relay retries
		// them through N-write), so nothing can land only there.
		if st, b := estest.Call(t, e.ES, "PUT", "/"+old+"/_doc/a0000002?version=60&version_type=external", `{"outboxd_deleted":true}`); st != 403 || !strings.Contains(string(b), "cluster_block_exception") {
			t.Fatalf("a write to the old index after the rebuild: HTTP %d %s; want it refused by the write block", st, b)
		}
		if _, err := DropOld(ctx, e.Pool, e.Schema, e.ES, e.Name); err != nil {
			t.Fatal(err)
		}
		if docs := estest.SearchRead(t, e.ES, e.Name); len(docs) != 10 {
			t.Fatalf("%d documents visible, want 10", len(docs))
		}
	})

	t.Run("a rebuild killed after the swap but before storing it is finished by the next run and cannot be aborted", func(t *testing.T) {
		t.Parallel()
		e := setupRebuild(t, 10)
		if _, err := Run(ctx, rebuildOpts(e)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Pool.Exec(ctx, `UPDATE "`+e.Schema+`".rebuilds SET phase = 'catching_up', swapped_at = NULL, finished_at = NULL`); err != nil {
			t.Fatal(err)
		}
		if _, err := Abort(ctx, e.Pool, e.Schema, e.ES, e.Name); err == nil || !strings.Contains(err.Error(), "already swapped") {
			t.Fatalf("abort: %v", err)
		}
		rep, err := Run(ctx, rebuildOpts(e))
		if err != nil || rep.Resumed != PhaseSwapped || rep.NewIndex != e.Name+"-000002" {
			t.Fatalf("rerun: %+v, %v", rep, err)
		}
		if p, _ := phase(t, e); p != PhaseDone {
			t.Fatalf("phase %s", p)
		}
	})

	t.Run("bad options are refused naming the option", func(t *testing.T) {
		t.Parallel()
		pool, es := new(pgxpool.Pool), new(elasticsearch.Client) // refused before any use
		for _, c := range []struct {
			o    Options
			want string
		}{
			{Options{ES: es, Index: "x"}, "pool"},
			{Options{Pool: pool, Index: "x"}, "client"},
			{Options{Pool: pool, ES: es, Index: "X"}, "lowercase"},
			{Options{Pool: pool, ES: es, Index: "x", From: "elsewhere"}, `from: must be "index" or "source"`},
			// from=source without source_sql reads the index's definition
			// and is refused only without one: TestRebuildDefinition.
			{Options{Pool: pool, ES: es, Index: "x", SourceSQL: "SELECT 1"}, "source_sql: only used with from=source"},
			{Options{Pool: pool, ES: es, Index: "x", Keep: -time.Second}, "keep: must not be negative"},
		} {
			if _, err := Run(ctx, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%+v: %v, want %q", c.o, err, c.want)
			}
		}
	})
}

// proveRebuild runs a rebuild from the index or from the source through
// two kills, with writers, a relay SIGKILLed once and a searcher, and
// checks the new index against the table.
func proveRebuild(t *testing.T, from string) {
	ctx := context.Background()
	rows := rebuildDocs(t)
	// Three shards from the index: checkpoints and catch-up are per shard,
	// and the new index takes the old one's settings.
	spec := keywordSpec
	if from == "index" {
		spec = `{"settings":{"index":{"number_of_shards":3,"number_of_replicas":0}},"mappings":{"properties":{"title":{"type":"keyword"}}}}`
	}
	e := setupRebuildSpec(t, rows, spec)
	old, next := indexer.FirstIndex(e.Name), e.Name+"-000002"
	kill := e.StartRelayProcess(t)
	wr := e.StartWriters(t, 8, rows)
	search := startSearcher(t, e.ES, e.Name)
	started := time.Now()

	// Killed during the copy.
	o := rebuildOpts(e)
	o.Batch = 500
	if from == "source" {
		o.From, o.SourceSQL = "source", e.SQL()
	}
	_, err := Run(cancelWhen(func() bool {
		var n int64
		_ = e.Pool.QueryRow(ctx, `SELECT coalesce(max(copied), 0) FROM "`+e.Schema+`".rebuilds`).Scan(&n)
		return n >= int64(rows/3)
	}), o)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v; want it cancelled during the copy", err)
	}
	if p, n := phase(t, e); p != PhaseCopying || n >= int64(rows) {
		t.Fatalf("after the first run: phase %s, %d copied", p, n)
	} else {
		t.Logf("first run: %d copied in %s, then killed", n, time.Since(started).Round(time.Millisecond))
	}
	if got := aliasTarget(t, e.ES, e.Name); got != old {
		t.Fatalf("during the copy %s points at %s", e.Name, got)
	}
	// The relay dies abruptly once, and another takes over.
	kill()
	stopRelay := e.StartRelay(t)

	// Killed during the catch-up, once a round has stored its checkpoints:
	// the copy starts over (it was interrupted), then the first round's
	// log line cancels the run before its next request.
	cctx, cancel := context.WithCancel(ctx)
	o.Logger = slog.New(cancelOn{msg: "rebuild caught up", cancel: cancel})
	_, err = Run(cctx, o)
	cancel()
	o.Logger = nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("second run: %v; want it cancelled during the catch-up", err)
	}
	if p, _ := phase(t, e); p != PhaseCatchingUp {
		t.Fatalf("after the second run: phase %s", p)
	}
	if got := aliasTarget(t, e.ES, e.Name); got != old {
		t.Fatalf("during the catch-up %s points at %s", e.Name, got)
	}

	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(started)
	if rep.Resumed != PhaseCatchingUp || !rep.Swapped || rep.NewIndex != next || rep.Rejected != 0 {
		t.Fatalf("third run: %+v", rep)
	}
	// Writes keep arriving through the new index for a while.
	time.Sleep(time.Second)
	updates, deletes := wr.Stop(t)
	e.WaitBacklog(t)
	stopRelay()
	search.stop(t)
	t.Logf("rebuild from the %s of %d documents: %s in three runs (the last %.1fs, %d copied); last run %d catch-up rounds, %d caught up; writers: %d updates, %d deletes",
		from, rows, took.Round(time.Millisecond), rep.Seconds, rep.Copied, rep.Rounds, rep.CaughtUp, updates, deletes)

	for _, a := range []string{e.Name, indexer.WriteAlias(e.Name), indexer.ReadAlias(e.Name)} {
		if got := aliasTarget(t, e.ES, a); got != next {
			t.Fatalf("%s points at %s, want %s", a, got, next)
		}
	}
	e.AssertProjection(t)
	if from == "index" {
		if st, b := estest.Call(t, e.ES, "GET", "/"+next+"/_settings/index.number_of_shards", ""); st != 200 || !strings.Contains(string(b), `"number_of_shards":"3"`) {
			t.Fatalf("shards of %s: %d %s", next, st, b)
		}
	}
	st, b := estest.Call(t, e.ES, "GET", "/"+next+"/_mapping/field/title", "")
	if st != 200 || !strings.Contains(string(b), `"type":"text"`) {
		t.Fatalf("mapping of title in %s: %d %s", next, st, b)
	}
	if n := countMatch(t, e.ES, e.Name, "edited"); n == 0 {
		t.Fatal("a word of a text title finds nothing")
	}

	dropped, err := DropOld(ctx, e.Pool, e.Schema, e.ES, e.Name)
	if err != nil || len(dropped) != 1 || dropped[0] != old {
		t.Fatalf("drop old: %v, %v", dropped, err)
	}
	if ok, _ := indexExists(ctx, e.ES, old); ok {
		t.Fatalf("%s still exists", old)
	}
	e.AssertProjection(t)
}
