package repair

import (
	"context"
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
