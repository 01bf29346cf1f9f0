package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/backfill"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/scan"
)

// keywordSpec is the layout before the rebuild: title is a keyword, so a
// search for one word of it finds nothing; textMappings makes it text.
const (
	keywordSpec  = `{"mappings":{"properties":{"title":{"type":"keyword"}}}}`
	textMappings = `{"properties":{"title":{"type":"text"}}}`
)

// setupRebuild is a backfillEnv whose index holds every row of the table
// (title a keyword), and whose later concrete indices are deleted when the
// test ends.
func setupRebuild(t *testing.T, rows int) *backfillEnv {
	return setupRebuildSpec(t, rows, keywordSpec)
}

// setupRebuildSpec is setupRebuild with the index made from spec.
func setupRebuildSpec(t *testing.T, rows int, spec string) *backfillEnv {
	t.Helper()
	e := setupBackfill(t, rows)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for i := 2; i <= 4; i++ {
			ix := fmt.Sprintf("%s-%06d", e.name, i)
			if _, err := indexer.Perform(ctx, e.es, "delete index", esapi.IndicesDeleteRequest{Index: []string{ix}}); err != nil && !scan.IsStatus(err, 404) {
				t.Logf("cleanup %s: %v", ix, err)
			}
		}
	})
	if _, err := backfill.Run(context.Background(), e.opts(newSink(t, indexer.Options{Client: e.es, IndexSpec: []byte(spec)}))); err != nil {
		t.Fatal(err)
	}
	refresh(t, e.es, e.name)
	return e
}

func (e *backfillEnv) rebuildOpts() Options {
	return Options{Pool: e.pool, Schema: e.schema, ES: e.es, Index: e.name, Mappings: []byte(textMappings), Grace: 500 * time.Millisecond}
}

// aliasTarget returns the concrete indices behind alias.
func aliasTarget(t *testing.T, es *elasticsearch.Client, alias string) string {
	t.Helper()
	st, b := esCall(t, es, "GET", "/_alias/"+alias, "")
	if st != 200 {
		t.Fatalf("get alias %s: %d %s", alias, st, b)
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	var names []string
	for k := range m {
		names = append(names, k)
	}
	return strings.Join(names, ",")
}

func (e *backfillEnv) phase(t *testing.T) (phase string, copied int64) {
	t.Helper()
	err := e.pool.QueryRow(context.Background(), `SELECT phase, copied FROM "`+e.schema+`".rebuilds WHERE index_name = $1`, e.name).Scan(&phase, &copied)
	if err != nil {
		t.Fatal(err)
	}
	return phase, copied
}

// cancelWhen cancels the returned context once cond holds.
func cancelWhen(cond func() bool) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for ctx.Err() == nil {
			if cond() {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return ctx
}

// cancelOn is a log handler that cancels a run when it logs msg: a kill
// at a precise point of a rebuild.
type cancelOn struct {
	msg    string
	cancel func()
}

func (h cancelOn) Enabled(context.Context, slog.Level) bool { return true }
func (h cancelOn) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h cancelOn) WithGroup(string) slog.Handler            { return h }
func (h cancelOn) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.cancel()
	}
	return nil
}

// searcher polls N with random searches, as an application would, and
// counts failures and tombstones seen.
type searcher struct {
	done                          chan struct{}
	wg                            sync.WaitGroup
	searches, failures, tombstone atomic.Int64
	firstFailure                  atomic.Value
}

func startSearcher(t *testing.T, es *elasticsearch.Client, name string) *searcher {
	s := &searcher{done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case <-s.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			res, err := esapi.SearchRequest{Index: []string{name}, Body: strings.NewReader(`{"size":50,"query":{"function_score":{"random_score":{}}}}`)}.Do(context.Background(), es)
			s.searches.Add(1)
			if err != nil {
				s.failures.Add(1)
				s.firstFailure.CompareAndSwap(nil, err.Error())
				continue
			}
			var page struct {
				Hits struct {
					Hits []struct {
						Source json.RawMessage `json:"_source"`
					} `json:"hits"`
				} `json:"hits"`
			}
			err = json.NewDecoder(res.Body).Decode(&page)
			res.Body.Close()
			if res.StatusCode != 200 || err != nil || len(page.Hits.Hits) == 0 {
				s.failures.Add(1)
				s.firstFailure.CompareAndSwap(nil, fmt.Sprintf("HTTP %d, %d hits, %v", res.StatusCode, len(page.Hits.Hits), err))
				continue
			}
			for _, h := range page.Hits.Hits {
				if isTombstone(h.Source) {
					s.tombstone.Add(1)
				}
			}
		}
	}()
	return s
}

func (s *searcher) stop(t *testing.T) {
	close(s.done)
	s.wg.Wait()
	t.Logf("searcher: %d searches on the name, %d failed (first: %v), %d tombstones seen", s.searches.Load(), s.failures.Load(), s.firstFailure.Load(), s.tombstone.Load())
	if s.failures.Load() > 0 || s.tombstone.Load() > 0 || s.searches.Load() < 10 {
		t.Errorf("searches on the name: %d failed, %d tombstones seen, %d searches", s.failures.Load(), s.tombstone.Load(), s.searches.Load())
	}
}

// rebuildDocs is the size of the proof run: OUTBOXD_REBUILD_DOCS=200000
// for the full-size run by hand, 20,000 by default so that the race
// detector stays within a few minutes.
func rebuildDocs(t *testing.T) int {
	if v := os.Getenv("OUTBOXD_REBUILD_DOCS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1000 {
			t.Fatalf("OUTBOXD_REBUILD_DOCS=%q: want a number >= 1000", v)
		}
		return n
	}
	return 20_000
}

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
		mustWrite(t, newSink(t, indexer.Options{Client: e.es}), upsert(e.name, "odd", 1, `{"title":"x","n":"not a number"}`), upsert(e.name, "even", 1, `{"title":"y","n":"2"}`))
		o := e.rebuildOpts()
		o.Mappings = []byte(`{"mappings":{"properties":{"n":{"type":"long"}}}}`)
		rep, err := Run(ctx, o)
		var re *RejectedError
		if !errors.As(err, &re) || re.Rejected != 1 || len(rep.Samples) != 1 || rep.Samples[0].ID != "odd" || rep.Swapped {
			t.Fatalf("first run: %+v, %v", rep, err)
		}
		if got := aliasTarget(t, e.es, e.name); got != indexer.FirstIndex(e.name) {
			t.Fatalf("%s points at %s after a refused rebuild", e.name, got)
		}
		o.AcceptRejected = true
		rep, err = Run(ctx, o)
		if err != nil || !rep.Swapped || rep.Rejected != 1 {
			t.Fatalf("accepted: %+v, %v", rep, err)
		}
		docs := searchRead(t, e.es, e.name)
		if len(docs) != 6 || docs["odd"] != nil {
			t.Fatalf("visible after the swap: %d documents, odd %s", len(docs), docs["odd"])
		}
	})

	t.Run("abort removes the half-built index and a new rebuild starts over; a kept old index blocks the next rebuild until dropped", func(t *testing.T) {
		t.Parallel()
		e := setupRebuild(t, 3000)
		o := e.rebuildOpts()
		o.Batch = 100
		_, unlock, err := openStore(ctx, e.pool, e.schema, e.name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "another rebuild") {
			t.Fatalf("a second rebuild at once: %v", err)
		}
		unlock()
		_, err = Run(cancelWhen(func() bool {
			var n int64
			_ = e.pool.QueryRow(ctx, `SELECT coalesce(max(copied), 0) FROM "`+e.schema+`".rebuilds`).Scan(&n)
			return n >= 500
		}), o)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("first run: %v", err)
		}
		o.Mappings = nil
		if _, err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "other mappings") {
			t.Fatalf("rerun with other options: %v", err)
		}
		gone, err := Abort(ctx, e.pool, e.schema, e.es, e.name)
		if err != nil || gone != e.name+"-000002" {
			t.Fatalf("abort: %q, %v", gone, err)
		}
		if ok, _ := indexExists(ctx, e.es, gone); ok {
			t.Fatalf("%s still exists after abort", gone)
		}
		if p, _ := e.phase(t); p != PhaseAborted {
			t.Fatalf("phase after abort: %s", p)
		}
		if _, err := Abort(ctx, e.pool, e.schema, e.es, e.name); err == nil {
			t.Fatal("a second abort found something to abort")
		}

		// Without mappings the new index keeps the old one's.
		o.Keep = time.Hour
		rep, err := Run(ctx, o)
		if err != nil || !rep.Swapped || rep.NewIndex != e.name+"-000002" || rep.Copied != 3000 {
			t.Fatalf("rebuild after abort: %+v, %v", rep, err)
		}
		if st, b := esCall(t, e.es, "GET", "/"+rep.NewIndex+"/_mapping/field/title", ""); st != 200 || !strings.Contains(string(b), `"type":"keyword"`) {
			t.Fatalf("mapping of title: %d %s", st, b)
		}
		if _, err := Abort(ctx, e.pool, e.schema, e.es, e.name); err == nil {
			t.Fatal("abort after the swap succeeded")
		}
		if _, err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "kept until") {
			t.Fatalf("rebuild while the old index is kept: %v", err)
		}
		// Its time passed: the next rebuild drops it and goes on.
		if _, err := e.pool.Exec(ctx, `UPDATE "`+e.schema+`".rebuilds SET keep_until = now() - interval '1 second'`); err != nil {
			t.Fatal(err)
		}
		rep, err = Run(ctx, o)
		if err != nil || len(rep.DroppedOld) != 1 || rep.DroppedOld[0] != indexer.FirstIndex(e.name) || rep.NewIndex != e.name+"-000003" {
			t.Fatalf("rebuild after the keep time: %+v, %v", rep, err)
		}
		if ok, _ := indexExists(ctx, e.es, indexer.FirstIndex(e.name)); ok {
			t.Fatal("the expired old index still exists")
		}
		if docs := searchRead(t, e.es, e.name); len(docs) != 3000 {
			t.Fatalf("%d documents visible", len(docs))
		}
	})

	t.Run("from the source, rows come from the query and the index's tombstones keep deleted documents deleted", func(t *testing.T) {
		t.Parallel()
		e := setupRebuild(t, 4)
		// a0000002 was deleted at version 3 but the query still returns it
		// at version 1; the query says a0000003 is deleted.
		mustWrite(t, newSink(t, indexer.Options{Client: e.es}), del(e.name, "a0000002", 3))
		o := e.rebuildOpts()
		o.From, o.SourceSQL = "source", `SELECT id, version, json_build_object('id', id, 'title', 'from source ' || title), id = 'a0000003' FROM `+e.table
		rep, err := Run(ctx, o)
		if err != nil || !rep.Swapped {
			t.Fatalf("rebuild: %+v, %v", rep, err)
		}
		docs := searchRead(t, e.es, e.name)
		if len(docs) != 2 || docs["a0000002"] != nil || docs["a0000003"] != nil || !strings.Contains(string(docs["a0000001"]), "from source") {
			t.Fatalf("visible: %v", docs)
		}
		if d := getDoc(t, e.es, indexer.WriteAlias(e.name), "a0000002"); !isTombstone(d.Source) || d.Version != 3 {
			t.Fatalf("a0000002 in the new index: %+v", d)
		}
	})

	t.Run("writes that reach the old index after the swap are copied by the final catch-up, and later ones are refused", func(t *testing.T) {
		t.Parallel()
		e := setupRebuild(t, 10)
		old := indexer.FirstIndex(e.name)
		o := e.rebuildOpts()
		o.Grace = 2 * time.Second
		// A bulk request that resolved N-write just before the swap lands
		// in the old index just after it.
		late := make(chan int, 1)
		go func() {
			deadline := time.Now().Add(time.Minute)
			for time.Now().Before(deadline) {
				var p string
				_ = e.pool.QueryRow(ctx, `SELECT phase FROM "`+e.schema+`".rebuilds`).Scan(&p)
				if p == PhaseSwapped {
					st, _ := esCall(t, e.es, "PUT", "/"+old+"/_doc/a0000001?version=50&version_type=external", `{"title":"late"}`)
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
		if d := getDoc(t, e.es, e.name, "a0000001"); d.Version != 50 || !strings.Contains(string(d.Source), "late") {
			t.Fatalf("after the final catch-up: %+v", d)
		}
		// Later still: the old index refuses writes (the relay retries
		// them through N-write), so nothing can land only there.
		if st, b := esCall(t, e.es, "PUT", "/"+old+"/_doc/a0000002?version=60&version_type=external", `{"outboxd_deleted":true}`); st != 403 || !strings.Contains(string(b), "cluster_block_exception") {
			t.Fatalf("a write to the old index after the rebuild: HTTP %d %s; want it refused by the write block", st, b)
		}
		if _, err := DropOld(ctx, e.pool, e.schema, e.es, e.name); err != nil {
			t.Fatal(err)
		}
		if docs := searchRead(t, e.es, e.name); len(docs) != 10 {
			t.Fatalf("%d documents visible, want 10", len(docs))
		}
	})

	t.Run("a rebuild killed after the swap but before storing it is finished by the next run and cannot be aborted", func(t *testing.T) {
		t.Parallel()
		e := setupRebuild(t, 10)
		if _, err := Run(ctx, e.rebuildOpts()); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(ctx, `UPDATE "`+e.schema+`".rebuilds SET phase = 'catching_up', swapped_at = NULL, finished_at = NULL`); err != nil {
			t.Fatal(err)
		}
		if _, err := Abort(ctx, e.pool, e.schema, e.es, e.name); err == nil || !strings.Contains(err.Error(), "already swapped") {
			t.Fatalf("abort: %v", err)
		}
		rep, err := Run(ctx, e.rebuildOpts())
		if err != nil || rep.Resumed != PhaseSwapped || rep.NewIndex != e.name+"-000002" {
			t.Fatalf("rerun: %+v, %v", rep, err)
		}
		if p, _ := e.phase(t); p != PhaseDone {
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
			{Options{Pool: pool, ES: es, Index: "x", From: "source"}, "source_sql: required"},
			{Options{Pool: pool, ES: es, Index: "x", SourceSQL: "SELECT 1"}, "source_sql: only used with from=source"},
			{Options{Pool: pool, ES: es, Index: "x", Keep: -time.Second}, "keep: must not be negative"},
		} {
			if _, err := Run(ctx, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%+v: %v, want %q", c.o, err, c.want)
			}
		}
	})
}

// countMatch counts the documents of name whose title matches word.
func countMatch(t *testing.T, es *elasticsearch.Client, name, word string) int64 {
	t.Helper()
	st, b := esCall(t, es, "POST", "/"+name+"/_count", `{"query":{"match":{"title":"`+word+`"}}}`)
	var out struct {
		Count int64 `json:"count"`
	}
	if st != 200 || json.Unmarshal(b, &out) != nil {
		t.Fatalf("count: %d %s", st, b)
	}
	return out.Count
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
	old, next := indexer.FirstIndex(e.name), e.name+"-000002"
	kill := e.startRelayProcess(t)
	wr := e.startWriters(t, 8, rows)
	search := startSearcher(t, e.es, e.name)
	started := time.Now()

	// Killed during the copy.
	o := e.rebuildOpts()
	o.Batch = 500
	if from == "source" {
		o.From, o.SourceSQL = "source", e.sourceSQL()
	}
	_, err := Run(cancelWhen(func() bool {
		var n int64
		_ = e.pool.QueryRow(ctx, `SELECT coalesce(max(copied), 0) FROM "`+e.schema+`".rebuilds`).Scan(&n)
		return n >= int64(rows/3)
	}), o)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v; want it cancelled during the copy", err)
	}
	if p, n := e.phase(t); p != PhaseCopying || n >= int64(rows) {
		t.Fatalf("after the first run: phase %s, %d copied", p, n)
	} else {
		t.Logf("first run: %d copied in %s, then killed", n, time.Since(started).Round(time.Millisecond))
	}
	if got := aliasTarget(t, e.es, e.name); got != old {
		t.Fatalf("during the copy %s points at %s", e.name, got)
	}
	// The relay dies abruptly once, and another takes over.
	kill()
	stopRelay := e.startRelay(t)

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
	if p, _ := e.phase(t); p != PhaseCatchingUp {
		t.Fatalf("after the second run: phase %s", p)
	}
	if got := aliasTarget(t, e.es, e.name); got != old {
		t.Fatalf("during the catch-up %s points at %s", e.name, got)
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
	updates, deletes := wr.stop(t)
	e.waitBacklog(t)
	stopRelay()
	search.stop(t)
	t.Logf("rebuild from the %s of %d documents: %s in three runs (the last %.1fs, %d copied); last run %d catch-up rounds, %d caught up; writers: %d updates, %d deletes",
		from, rows, took.Round(time.Millisecond), rep.Seconds, rep.Copied, rep.Rounds, rep.CaughtUp, updates, deletes)

	for _, a := range []string{e.name, indexer.WriteAlias(e.name), indexer.ReadAlias(e.name)} {
		if got := aliasTarget(t, e.es, a); got != next {
			t.Fatalf("%s points at %s, want %s", a, got, next)
		}
	}
	e.assertProjection(t)
	if from == "index" {
		if st, b := esCall(t, e.es, "GET", "/"+next+"/_settings/index.number_of_shards", ""); st != 200 || !strings.Contains(string(b), `"number_of_shards":"3"`) {
			t.Fatalf("shards of %s: %d %s", next, st, b)
		}
	}
	st, b := esCall(t, e.es, "GET", "/"+next+"/_mapping/field/title", "")
	if st != 200 || !strings.Contains(string(b), `"type":"text"`) {
		t.Fatalf("mapping of title in %s: %d %s", next, st, b)
	}
	if n := countMatch(t, e.es, e.name, "edited"); n == 0 {
		t.Fatal("a word of a text title finds nothing")
	}

	dropped, err := DropOld(ctx, e.pool, e.schema, e.es, e.name)
	if err != nil || len(dropped) != 1 || dropped[0] != old {
		t.Fatalf("drop old: %v, %v", dropped, err)
	}
	if ok, _ := indexExists(ctx, e.es, old); ok {
		t.Fatalf("%s still exists", old)
	}
	e.assertProjection(t)
}
