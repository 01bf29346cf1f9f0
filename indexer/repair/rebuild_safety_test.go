package repair

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
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
