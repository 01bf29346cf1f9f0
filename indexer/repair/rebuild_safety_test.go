package repair

import (
	"context"
	"errors"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// settingsOf returns the flat settings of index as one JSON text.
func settingsOf(t *testing.T, e *backfillEnv, index string) string {
	t.Helper()
	st, b := esCall(t, e.es, "GET", "/"+index+"/_settings?flat_settings=true", "")
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
	o := e.rebuildOpts()
	o.Mappings = nil
	o.Settings = []byte(`{"settings":{"index":{"refresh_interval":"2s"}}}`)
	rep, err := Rebuild(context.Background(), o)
	if err != nil || !rep.Swapped {
		t.Fatalf("rebuild: %+v, %v", rep, err)
	}
	got := settingsOf(t, e, rep.NewIndex)
	for _, want := range []string{`"index.refresh_interval":"2s"`, `"index.number_of_shards":"2"`, `"index.number_of_replicas":"0"`, `"index.gc_deletes":"1h"`, `"index.analysis.analyzer.folded.tokenizer":"standard"`} {
		if !strings.Contains(got, want) {
			t.Errorf("settings of %s after --settings with only refresh_interval: %s missing in %s", rep.NewIndex, want, got)
		}
	}
	if docs := searchRead(t, e.es, e.name); len(docs) != 20 {
		t.Fatalf("%d documents visible", len(docs))
	}
}

func TestRebuildKilledAfterSwapThenDropOld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupRebuild(t, 30)
	o := e.rebuildOpts()
	cctx, cancel := context.WithCancel(ctx)
	o.Logger = slog.New(cancelOn{msg: "rebuild swapped", cancel: cancel})
	_, err := Rebuild(cctx, o)
	cancel()
	o.Logger = nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v; want it killed after the swap", err)
	}
	if p, _ := e.phase(t); p != PhaseSwapped {
		t.Fatalf("phase after the kill: %s", p)
	}
	if _, err := AbortRebuild(ctx, e.pool, e.schema, e.es, e.name); err == nil || !strings.Contains(err.Error(), "--drop-old") {
		t.Fatalf("abort of a swapped rebuild: %v; want it to say the way forward", err)
	}
	if _, err := DropOldIndex(ctx, e.pool, e.schema, e.es, e.name); err != nil {
		t.Fatalf("drop-old: %v", err)
	}
	if p, _ := e.phase(t); p != PhaseDone {
		t.Errorf("phase after drop-old of a swapped rebuild: %s, want done", p)
	}
	if open, err := Rebuilds(ctx, e.pool, e.schema); err != nil || len(open) != 0 {
		t.Errorf("rebuilds in progress after drop-old: %+v, %v", open, err)
	}
	o.Mappings = nil
	rep, err := Rebuild(ctx, o)
	if err != nil || !rep.Swapped || rep.NewIndex != e.name+"-000003" {
		t.Fatalf("the next rebuild: %+v, %v", rep, err)
	}
	if docs := searchRead(t, e.es, e.name); len(docs) != 30 {
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
			_, err := Rebuild(context.Background(), e.rebuildOpts())
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--from source") {
				t.Fatalf("rebuild from the index: %v; want a refusal naming %q and --from source", err, c.want)
			}
			if ok, _ := indexExists(context.Background(), e.es, e.name+"-000002"); ok {
				t.Fatal("the refused rebuild created the new index")
			}
		})
	}
}

func TestRebuildNeverDeletesLiveIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupRebuild(t, 20)
	first, second := indexer.FirstIndex(e.name), e.name+"-000002"
	o := e.rebuildOpts()
	o.Keep = time.Hour
	if rep, err := Rebuild(ctx, o); err != nil || !rep.Swapped {
		t.Fatalf("rebuild: %+v, %v", rep, err)
	}
	// The operator undoes the rebuild: every name back on the old index.
	filter := indexer.ReadFilter
	body := `{"actions":[
		{"remove":{"index":"` + second + `","alias":"` + indexer.WriteAlias(e.name) + `"}},
		{"remove":{"index":"` + second + `","alias":"` + e.name + `"}},
		{"remove":{"index":"` + second + `","alias":"` + indexer.ReadAlias(e.name) + `"}},
		{"add":{"index":"` + first + `","alias":"` + indexer.WriteAlias(e.name) + `","is_write_index":true}},
		{"add":{"index":"` + first + `","alias":"` + e.name + `","filter":` + filter + `}},
		{"add":{"index":"` + first + `","alias":"` + indexer.ReadAlias(e.name) + `","filter":` + filter + `}}]}`
	if st, b := esCall(t, e.es, "POST", "/_aliases", body); st != 200 {
		t.Fatalf("move the aliases back: %d %s", st, b)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE "`+e.schema+`".rebuilds SET keep_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	_, err := Rebuild(ctx, o)
	t.Logf("rebuild after the undo: %v", err)
	if ok, _ := indexExists(ctx, e.es, first); !ok {
		t.Fatalf("the rebuild after the undo deleted %s, the index the names point at", first)
	}
	if _, err := DropOldIndex(ctx, e.pool, e.schema, e.es, e.name); err == nil || !strings.Contains(err.Error(), "never deletes") {
		t.Fatalf("drop-old of the live index: %v; want a refusal", err)
	}
	if docs := searchRead(t, e.es, e.name); len(docs) != 20 {
		t.Fatalf("%d documents visible after the undo, want 20", len(docs))
	}

	// The names gone altogether while a later concrete index is there: the
	// sink does not create an empty first index beside it, and says why.
	esCall(t, e.es, "DELETE", "/"+first, "")
	esCall(t, e.es, "DELETE", "/"+second+"/_alias/*", "")
	_, err = newSink(t, indexer.Options{Client: e.es}).Write(ctx, []outbox.Event{upsert(e.name, "new", 1, `{"title":"x"}`)})
	if !indexer.IsConfig(err) || !strings.Contains(err.Error(), second+" exists") {
		t.Fatalf("a write with the aliases gone and %s there: %v; want the sink paused, naming %s", second, err, second)
	}
	if ok, _ := indexExists(ctx, e.es, first); ok {
		t.Fatalf("bootstrap created an empty %s beside %s", first, second)
	}
}
