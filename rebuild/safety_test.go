package rebuild

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/outbox"
)

// settingsOf returns the flat settings of index as one JSON text.
func settingsOf(t *testing.T, e *tooltest.Source, index string) string {
	t.Helper()
	st, b := estest.Call(t, e.ES, "GET", "/"+index+"/_settings?flat_settings=true", "")
	if st != 200 {
		t.Fatalf("settings of %s: %d %s", index, st, b)
	}
	return string(b)
}

func TestRebuildSettingsMerge(t *testing.T) {
	t.Parallel()
	spec := `{"settings":{"index":{"number_of_shards":2,"number_of_replicas":0,"gc_deletes":"1h",
		"analysis":{"analyzer":{"folded":{"type":"custom","tokenizer":"standard","filter":["lowercase"]}}}}},
		"mappings":{"properties":{"title":{"type":"keyword"}}}}`
	e := setupRebuildSpec(t, 20, spec)
	o := rebuildOpts(e)
	o.Mappings = nil
	o.Settings = []byte(`{"settings":{"index":{"refresh_interval":"2s"}}}`)
	rep, err := Run(context.Background(), o)
	if err != nil || !rep.Swapped {
		t.Fatalf("rebuild: %+v, %v", rep, err)
	}
	got := settingsOf(t, e, rep.NewIndex)
	for _, want := range []string{`"index.refresh_interval":"2s"`, `"index.number_of_shards":"2"`, `"index.number_of_replicas":"0"`, `"index.gc_deletes":"1h"`, `"index.analysis.analyzer.folded.tokenizer":"standard"`} {
		if !strings.Contains(got, want) {
			t.Errorf("settings of %s after --settings with only refresh_interval: %s missing in %s", rep.NewIndex, want, got)
		}
	}
	if docs := estest.SearchRead(t, e.ES, e.Name); len(docs) != 20 {
		t.Fatalf("%d documents visible", len(docs))
	}
}

func TestRebuildKilledAfterSwapThenDropOld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupRebuild(t, 30)
	o := rebuildOpts(e)
	cctx, cancel := context.WithCancel(ctx)
	o.Logger = slog.New(cancelOn{msg: "rebuild swapped", cancel: cancel})
	_, err := Run(cctx, o)
	cancel()
	o.Logger = nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v; want it killed after the swap", err)
	}
	if p, _ := phase(t, e); p != PhaseSwapped {
		t.Fatalf("phase after the kill: %s", p)
	}
	if _, err := Abort(ctx, e.Pool, e.Schema, e.ES, e.Name); err == nil || !strings.Contains(err.Error(), "--drop-old") {
		t.Fatalf("abort of a swapped rebuild: %v; want it to say the way forward", err)
	}
	if _, err := DropOld(ctx, e.Pool, e.Schema, e.ES, e.Name); err != nil {
		t.Fatalf("drop-old: %v", err)
	}
	if p, _ := phase(t, e); p != PhaseDone {
		t.Errorf("phase after drop-old of a swapped rebuild: %s, want done", p)
	}
	if open, err := Unfinished(ctx, e.Pool, e.Schema); err != nil || len(open) != 0 {
		t.Errorf("rebuilds in progress after drop-old: %+v, %v", open, err)
	}
	o.Mappings = nil
	rep, err := Run(ctx, o)
	if err != nil || !rep.Swapped || rep.NewIndex != e.Name+"-000003" {
		t.Fatalf("the next rebuild: %+v, %v", rep, err)
	}
	if docs := estest.SearchRead(t, e.ES, e.Name); len(docs) != 30 {
		t.Fatalf("%d documents visible", len(docs))
	}
}

func TestRebuildRefusesIndexWithoutFullSource(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ what, source, want string }{
		{"excluded fields", `{"excludes":["secret"]}`, "_source.excludes leaves out secret"},
		{"a disabled _source", `{"enabled":false}`, "_source is disabled"},
	} {
		t.Run("a copy from an index with "+c.what+" is refused, naming --from source", func(t *testing.T) {
			t.Parallel()
			e := setupRebuildSpec(t, 5, `{"mappings":{"_source":`+c.source+`,"properties":{"title":{"type":"keyword"}}}}`)
			_, err := Run(context.Background(), rebuildOpts(e))
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--from source") {
				t.Fatalf("rebuild from the index: %v; want a refusal naming %q and --from source", err, c.want)
			}
			if ok, _ := indexExists(context.Background(), e.ES, e.Name+"-000002"); ok {
				t.Fatal("the refused rebuild created the new index")
			}
		})
	}
}

func TestRebuildNeverDeletesLiveIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupRebuild(t, 20)
	first, second := indexer.FirstIndex(e.Name), e.Name+"-000002"
	o := rebuildOpts(e)
	o.Keep = time.Hour
	if rep, err := Run(ctx, o); err != nil || !rep.Swapped {
		t.Fatalf("rebuild: %+v, %v", rep, err)
	}
	// The operator undoes the rebuild: every name back on the old index.
	filter := indexer.ReadFilter
	body := `{"actions":[
		{"remove":{"index":"` + second + `","alias":"` + indexer.WriteAlias(e.Name) + `"}},
		{"remove":{"index":"` + second + `","alias":"` + e.Name + `"}},
		{"remove":{"index":"` + second + `","alias":"` + indexer.ReadAlias(e.Name) + `"}},
		{"add":{"index":"` + first + `","alias":"` + indexer.WriteAlias(e.Name) + `","is_write_index":true}},
		{"add":{"index":"` + first + `","alias":"` + e.Name + `","filter":` + filter + `}},
		{"add":{"index":"` + first + `","alias":"` + indexer.ReadAlias(e.Name) + `","filter":` + filter + `}}]}`
	if st, b := estest.Call(t, e.ES, "POST", "/_aliases", body); st != 200 {
		t.Fatalf("move the aliases back: %d %s", st, b)
	}
	if _, err := e.Pool.Exec(ctx, `UPDATE "`+e.Schema+`".rebuilds SET keep_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	_, err := Run(ctx, o)
	t.Logf("rebuild after the undo: %v", err)
	if ok, _ := indexExists(ctx, e.ES, first); !ok {
		t.Fatalf("the rebuild after the undo deleted %s, the index the names point at", first)
	}
	if _, err := DropOld(ctx, e.Pool, e.Schema, e.ES, e.Name); err == nil || !strings.Contains(err.Error(), "never deletes") {
		t.Fatalf("drop-old of the live index: %v; want a refusal", err)
	}
	if docs := estest.SearchRead(t, e.ES, e.Name); len(docs) != 20 {
		t.Fatalf("%d documents visible after the undo, want 20", len(docs))
	}

	// The names gone altogether while a later concrete index is there: the
	// sink does not create an empty first index beside it, and says why.
	estest.Call(t, e.ES, "DELETE", "/"+first, "")
	estest.Call(t, e.ES, "DELETE", "/"+second+"/_alias/*", "")
	_, err = tooltest.NewSink(t, indexer.Options{Client: e.ES}).Write(ctx, []outbox.Event{estest.Upsert(e.Name, "new", 1, `{"title":"x"}`)})
	if !indexer.IsConfig(err) || !strings.Contains(err.Error(), second+" exists") {
		t.Fatalf("a write with the aliases gone and %s there: %v; want the sink paused, naming %s", second, err, second)
	}
	if ok, _ := indexExists(ctx, e.ES, first); ok {
		t.Fatalf("bootstrap created an empty %s beside %s", first, second)
	}
}

func TestBootstrapRefusesToStartARebuiltIndexOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupRebuild(t, 20)
	first, second := indexer.FirstIndex(e.Name), e.Name+"-000002"
	if rep, err := Run(ctx, rebuildOpts(e)); err != nil || !rep.Swapped {
		t.Fatalf("rebuild: %+v, %v", rep, err)
	}
	if _, err := DropOld(ctx, e.Pool, e.Schema, e.ES, e.Name); err != nil {
		t.Fatalf("drop-old: %v", err)
	}
	// The rebuilt index deleted by hand, with its aliases: no index of the
	// name is left, only the rebuilds table remembers where it lived.
	if st, b := estest.Call(t, e.ES, "DELETE", "/"+second, ""); st != 200 {
		t.Fatalf("delete %s: %d %s", second, st, b)
	}
	sink := tooltest.NewSink(t, indexer.Options{Client: e.ES, Rebuilt: Home(e.Pool, e.Schema)})
	_, err := sink.Write(ctx, []outbox.Event{estest.Upsert(e.Name, "new", 1, `{"title":"x"}`)})
	if !indexer.IsConfig(err) || !strings.Contains(err.Error(), second+", which is gone") || !strings.Contains(err.Error(), "--forget") {
		t.Fatalf("a write after %s was deleted: %v; want the sink paused, naming %s and --forget", second, err, second)
	}
	if ok, _ := indexExists(ctx, e.ES, first); ok {
		t.Fatalf("bootstrap created an empty %s in place of the rebuilt %s", first, second)
	}

	t.Run("forget refuses while an index the record names exists", func(t *testing.T) {
		if st, b := estest.Call(t, e.ES, "PUT", "/"+second, ""); st != 200 {
			t.Fatalf("create %s: %d %s", second, st, b)
		}
		if err := Forget(ctx, e.Pool, e.Schema, e.ES, e.Name); err == nil || !strings.Contains(err.Error(), second+" still exists") {
			t.Fatalf("forget with %s there: %v; want a refusal", second, err)
		}
		estest.Call(t, e.ES, "DELETE", "/"+second, "")
	})
	t.Run("after forget the index starts over empty", func(t *testing.T) {
		if err := Forget(ctx, e.Pool, e.Schema, e.ES, e.Name); err != nil {
			t.Fatalf("forget: %v", err)
		}
		outs, err := sink.Write(ctx, []outbox.Event{estest.Upsert(e.Name, "new", 1, `{"title":"x"}`)})
		if err != nil || outs[0].Status != outbox.Applied {
			t.Fatalf("write after forget: %+v, %v", outs, err)
		}
		if ok, _ := indexExists(ctx, e.ES, first); !ok {
			t.Fatalf("%s not created after forget", first)
		}
	})
}

func TestRebuildThatLostItsLockStops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupRebuild(t, 200)
	key := e.Schema + "." + e.Name
	var second *Report
	var secondErr error
	o := rebuildOpts(e)
	o.Batch = 50
	// After the first catch-up round of run A, its lock's session is
	// terminated and run B does the whole rebuild; then A goes on.
	o.Logger = slog.New(onLog{msg: "rebuild caught up", once: new(sync.Once), f: func() {
		// The pid first, then only that one session is terminated.
		var pids []int32
		rows, err := e.Pool.Query(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted
			AND classid::bigint = hashtext('outboxd.rebuild')::bigint & 4294967295 AND objid::bigint = hashtext($1)::bigint & 4294967295`, key)
		if err == nil {
			for rows.Next() {
				var pid int32
				if rows.Scan(&pid) == nil {
					pids = append(pids, pid)
				}
			}
			rows.Close()
		}
		if err != nil || len(pids) != 1 {
			t.Errorf("the lock's session: %v, %v", pids, err)
			return
		}
		var ok bool
		if err := e.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, pids[0]).Scan(&ok); err != nil || !ok {
			t.Errorf("terminate %d: %t, %v", pids[0], ok, err)
		}
		b := rebuildOpts(e)
		second, secondErr = Run(ctx, b)
	}})
	first, err := Run(ctx, o)
	if secondErr != nil || second == nil || !second.Swapped {
		t.Fatalf("run B: %+v, %v", second, secondErr)
	}
	if !errors.Is(err, ErrLostLock) {
		t.Fatalf("run A after losing its lock: %+v, %v; want ErrLostLock", first, err)
	}
	if first.Run == second.Run || !strings.Contains(err.Error(), first.Run) {
		t.Errorf("run ids: A %q, B %q; A's error %v should name A", first.Run, second.Run, err)
	}
	var phase, run string
	var finished bool
	if err := e.Pool.QueryRow(ctx, `SELECT phase, run_id, finished_at IS NOT NULL FROM "`+e.Schema+`".rebuilds`).Scan(&phase, &run, &finished); err != nil {
		t.Fatal(err)
	}
	if phase != PhaseDone || !finished || run != second.Run {
		t.Fatalf("the row after both runs: phase %s, finished %t, run %s; want done, finished, by B %s", phase, finished, run, second.Run)
	}
	if got := aliasTarget(t, e.ES, e.Name); got != second.NewIndex {
		t.Fatalf("%s points at %s, want %s", e.Name, got, second.NewIndex)
	}
	if docs := estest.SearchRead(t, e.ES, e.Name); len(docs) != 200 {
		t.Fatalf("%d documents visible", len(docs))
	}
}

func TestRebuildWithOtherSettingsDoesNotSilentlyFinishTheOldOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupRebuild(t, 10)
	if _, err := Run(ctx, rebuildOpts(e)); err != nil {
		t.Fatal(err)
	}
	// Killed after the swap, before storing it.
	if _, err := e.Pool.Exec(ctx, `UPDATE "`+e.Schema+`".rebuilds SET phase = 'catching_up', swapped_at = NULL, finished_at = NULL`); err != nil {
		t.Fatal(err)
	}
	o := rebuildOpts(e)
	o.Mappings = nil
	o.Settings = []byte(`{"index":{"refresh_interval":"3s"}}`)
	rep, err := Run(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "NOT applied") {
		t.Fatalf("rebuild --settings over an unfinished rebuild: %+v, %v; want an error saying the settings were not applied", rep, err)
	}
	if p, _ := phase(t, e); p != PhaseDone {
		t.Fatalf("phase of the earlier rebuild: %s", p)
	}
	if _, err := DropOld(ctx, e.Pool, e.Schema, e.ES, e.Name); err != nil {
		t.Fatal(err)
	}
	rep, err = Run(ctx, o)
	if err != nil || !rep.Swapped || !strings.Contains(settingsOf(t, e, rep.NewIndex), `"index.refresh_interval":"3s"`) {
		t.Fatalf("the rebuild run again: %+v, %v", rep, err)
	}
}
