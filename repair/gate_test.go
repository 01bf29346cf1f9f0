package repair

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/outbox"
)

// Repair and restore write through the same version gate as the sink: these
// tests run the sink and the repair tool against one index, in the order an
// operator and the relay would.

// repairApply plans and applies a repair of ri and returns the plan and the
// backup path.
func repairApply(t *testing.T, ri *tooltest.Family, opts Options) (*Plan, *Result, string) {
	t.Helper()
	ri.Refresh(t)
	opts.Index = ri.Name
	plan, err := PlanDuplicates(context.Background(), ri.ES, opts)
	if err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "backup.ndjson")
	res, err := plan.Apply(context.Background(), ri.ES, ApplyOptions{BackupPath: backup})
	if err != nil {
		t.Fatal(err)
	}
	return plan, res, backup
}

func mustApply(t *testing.T, s *indexer.Sink, events ...outbox.Event) {
	t.Helper()
	for i, o := range estest.MustWrite(t, s, events...) {
		if o.Status != outbox.Applied {
			t.Fatalf("event %s v%d: %s, want applied", events[i].SourceID, events[i].Version, o.Status)
		}
	}
}

func TestRepairRestoreUndoesOnlyItsOwnWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// a v1 written by outboxd; a legacy copy says version 2, so the repair
	// rewrites a at 2 over it and deletes the copy.
	setup := func(t *testing.T) (*tooltest.Family, *indexer.Sink, string) {
		ri := tooltest.NewFamily(t, false)
		sink := tooltest.NewSink(t, indexer.Options{Client: ri.ES})
		mustApply(t, sink, estest.Upsert(ri.Name, "a", 1, `{"title":"v1"}`))
		ri.Put(t, ri.Write, "legacy-a", 0, `{"source_id":"a","version":2,"title":"v2"}`)
		_, res, backup := repairApply(t, ri, Options{})
		if res.Rewritten != 1 || res.Removed != 1 || len(res.Skipped) != 0 {
			t.Fatalf("repair %+v", res)
		}
		return ri, sink, backup
	}
	skippedIDs := func(res *RestoreResult) []string {
		var ids []string
		for _, s := range res.Skipped {
			ids = append(ids, s.ID)
		}
		return ids
	}

	t.Run("a delete after the repair stays deleted and the restore reports it skipped", func(t *testing.T) {
		t.Parallel()
		ri, sink, backup := setup(t)
		mustApply(t, sink, estest.Delete(ri.Name, "a", 3))
		before := ri.Snapshot(t)

		res, err := Restore(ctx, ri.ES, backup, RestoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("restore %+v", res)
		if res.Raised != 0 || res.Restored != 0 || !reflect.DeepEqual(skippedIDs(res), []string{"a", "legacy-a"}) {
			t.Fatalf("restore %+v, want a and legacy-a skipped and nothing written", res)
		}
		if !strings.Contains(res.Skipped[0].Reason, "changed since the repair") {
			t.Errorf("reason %q does not say the document changed since the repair", res.Skipped[0].Reason)
		}
		if vis := ri.Visible(t); len(vis) != 0 {
			t.Fatalf("visible after restore: %v, want nothing (a was deleted at v3)", vis)
		}
		if after := ri.Snapshot(t); !reflect.DeepEqual(before, after) {
			t.Fatalf("restore wrote:\nbefore %v\nafter  %v", before, after)
		}
	})

	t.Run("a newer upsert after the repair is kept", func(t *testing.T) {
		t.Parallel()
		ri, sink, backup := setup(t)
		mustApply(t, sink, estest.Upsert(ri.Name, "a", 4, `{"title":"v4"}`))

		res, err := Restore(ctx, ri.ES, backup, RestoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Raised != 0 || res.Restored != 0 || len(res.Skipped) != 2 {
			t.Fatalf("restore %+v, want both documents skipped", res)
		}
		after := ri.Snapshot(t)
		if d := after[ri.Write+"/a"]; d.Version != 4 || d.Source != `{"title":"v4"}` {
			t.Fatalf("a is %+v, want v4 kept", d)
		}
		if vis := ri.Visible(t); !reflect.DeepEqual(vis, []string{ri.Write + "/a"}) {
			t.Fatalf("visible %v, want only a", vis)
		}
	})

	t.Run("an untouched repair is undone, and the outbox still applies afterwards", func(t *testing.T) {
		t.Parallel()
		ri, sink, backup := setup(t)
		res, err := Restore(ctx, ri.ES, backup, RestoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Raised != 2 || len(res.Skipped) != 0 {
			t.Fatalf("restore %+v, want a and legacy-a put back", res)
		}
		got := sourcesOf(ri.Snapshot(t))
		want := map[string]string{ri.Write + "/a": `{"title":"v1"}`, ri.Write + "/legacy-a": `{"source_id":"a","version":2,"title":"v2"}`}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("after restore %v, want %v", got, want)
		}
		// The restore replaced the repair's v2 write conditionally, so its
		// _version is 3: the next real update passes the gate.
		mustApply(t, sink, estest.Upsert(ri.Name, "a", 4, `{"title":"v4"}`))
	})

	t.Run("a backup without the records of the repair's writes is refused", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, false)
		ri.Put(t, ri.Write, "a", 1, `{"title":"v1"}`)
		before := ri.Snapshot(t)
		old := filepath.Join(t.TempDir(), "old.ndjson")
		body := `{"kind":"header","index":"` + ri.Name + `"}` + "\n" +
			`{"kind":"document","index":"` + ri.Write + `","_id":"a","_version":1,"_seq_no":0,"_primary_term":1,"_source":{"title":"old"}}` + "\n"
		if err := os.WriteFile(old, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Restore(ctx, ri.ES, old, RestoreOptions{})
		if err == nil || !strings.Contains(err.Error(), "format") || !strings.Contains(err.Error(), "nothing was changed") {
			t.Fatalf("err %v, want a format refusal", err)
		}
		if after := ri.Snapshot(t); !reflect.DeepEqual(before, after) {
			t.Fatal("a refused restore changed documents")
		}
	})
}

func TestRepairVersionOfKeepersWithoutBusinessVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a legacy copy edited 20 times is written at version 1 and the next update applies", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, false)
		for i := 1; i <= 20; i++ {
			ri.Put(t, ri.Write, "legacy-b", 0, fmt.Sprintf(`{"source_id":"b","title":"edit %d"}`, i))
		}
		ri.Refresh(t)
		plan, err := PlanDuplicates(ctx, ri.ES, Options{Index: ri.Name})
		if err != nil {
			t.Fatal(err)
		}
		if len(plan.Groups) != 1 || plan.Groups[0].Version != 1 || !strings.Contains(plan.Groups[0].VersionReason, "no copy has a business version") {
			t.Fatalf("plan %+v", plan.Groups)
		}
		var text strings.Builder
		if err := plan.WriteText(&text); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text.String(), "at version 1 (no copy has a business version (_version 20 counts writes)") {
			t.Errorf("the text plan does not say which version and why:\n%s", text.String())
		}
		js, _ := json.Marshal(plan)
		if !strings.Contains(string(js), `"version":1,"version_reason":"no copy has a business version`) {
			t.Errorf("the JSON plan does not say which version and why: %s", js)
		}
		if _, err := plan.Apply(ctx, ri.ES, ApplyOptions{BackupPath: filepath.Join(t.TempDir(), "b.ndjson")}); err != nil {
			t.Fatal(err)
		}
		if d := ri.Snapshot(t)[ri.Write+"/b"]; d.Version != 1 || d.Source != `{"source_id":"b","title":"edit 20"}` {
			t.Fatalf("b after repair: %+v", d)
		}

		sink := tooltest.NewSink(t, indexer.Options{Client: ri.ES})
		mustApply(t, sink, estest.Upsert(ri.Name, "b", 5, `{"title":"v5"}`))
		if d := ri.Snapshot(t)[ri.Write+"/b"]; d.Version != 5 || d.Source != `{"title":"v5"}` {
			t.Fatalf("b after the v5 update: %+v", d)
		}
	})

	t.Run("a business version beats a copy with more writes", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, false)
		sink := tooltest.NewSink(t, indexer.Options{Client: ri.ES})
		mustApply(t, sink, estest.Upsert(ri.Name, "c", 4, `{"title":"v4"}`))
		for i := 1; i <= 20; i++ {
			ri.Put(t, ri.Write, "legacy-c", 0, fmt.Sprintf(`{"source_id":"c","title":"edit %d"}`, i))
		}
		plan, res, _ := repairApply(t, ri, Options{})
		if len(plan.Groups) != 1 || plan.Groups[0].Keeper.ID != "c" || plan.Groups[0].Rewrite || res.Removed != 1 {
			t.Fatalf("plan %+v result %+v, want c kept in place", plan.Groups, res)
		}
		if !strings.Contains(plan.Groups[0].Reason, "business version 4") {
			t.Errorf("reason %q", plan.Groups[0].Reason)
		}
		mustApply(t, sink, estest.Upsert(ri.Name, "c", 5, `{"title":"v5"}`))
		if vis := ri.Visible(t); !reflect.DeepEqual(vis, []string{ri.Write + "/c"}) {
			t.Fatalf("visible %v", vis)
		}
	})
}

func TestRepairLeavesDocumentsWithoutTheKeyAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("documents without source_id outside the write index are neither moved nor deleted", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, true)
		w, o := ri.Write, ri.Old
		ri.Put(t, w, "r1a", 0, `{"source_id":"s1","version":1,"title":"old"}`)
		ri.Put(t, o, "r1b", 0, `{"source_id":"s1","version":2,"title":"new"}`)
		ri.Put(t, o, "nokey1", 0, `{"title":"no key 1"}`)
		ri.Put(t, o, "nokey2", 3, `{"title":"no key 2"}`)
		ri.Put(t, w, "nokey3", 0, `{"title":"no key, in the write index"}`)
		ri.Refresh(t)
		before := ri.Snapshot(t)

		plan, err := PlanDuplicates(ctx, ri.ES, Options{Index: ri.Name})
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		_ = plan.WriteText(&text)
		if s := plan.Summary(); s.Ungroupable != 2 || s.Groups != 1 || s.Remove != 2 || s.Rewrite != 1 {
			t.Fatalf("summary %+v\n%s", s, text.String())
		}
		if !strings.Contains(text.String(), "2 without key (left alone") {
			t.Errorf("summary text:\n%s", text.String())
		}
		res, err := plan.Apply(ctx, ri.ES, ApplyOptions{BackupPath: filepath.Join(t.TempDir(), "b.ndjson")})
		if err != nil {
			t.Fatal(err)
		}
		if res.Rewritten != 1 || res.Removed != 2 || len(res.Skipped) != 0 {
			t.Fatalf("result %+v", res)
		}
		after := ri.Snapshot(t)
		for _, k := range []string{o + "/nokey1", o + "/nokey2", w + "/nokey3"} {
			if after[k] != before[k] {
				t.Errorf("%s changed: %+v, was %+v", k, after[k], before[k])
			}
		}
		want := []string{o + "/nokey1", o + "/nokey2", w + "/nokey3", w + "/s1"}
		if got := ri.Visible(t); !reflect.DeepEqual(got, want) {
			t.Fatalf("visible %v, want %v", got, want)
		}
	})

	t.Run("--include-missing-key groups them by _id and says so", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, true)
		ri.Put(t, ri.Old, "nokey1", 0, `{"title":"no key 1"}`)
		ri.Refresh(t)
		plan, err := PlanDuplicates(ctx, ri.ES, Options{Index: ri.Name, IncludeMissingKey: true})
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		_ = plan.WriteText(&text)
		if s := plan.Summary(); s.Ungroupable != 0 || s.KeyedByID != 1 || s.Rewrite != 1 || !strings.Contains(text.String(), "1 more without a source_id field grouped by _id") {
			t.Fatalf("summary %+v\n%s", s, text.String())
		}
	})

	t.Run("a rewrite never replaces a document without the key at its target", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, false)
		ri.Put(t, ri.Write, "s9", 2, `{"title":"no url"}`)
		ri.Put(t, ri.Write, "r9", 0, `{"source_id":"s9","version":3,"canonical_url":"https://x/9"}`)
		ri.Refresh(t)
		before := ri.Snapshot(t)
		plan, err := PlanDuplicates(ctx, ri.ES, Options{Index: ri.Name, Key: []string{"canonical_url"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(plan.Groups) != 1 || !strings.Contains(plan.Groups[0].Conflict, "without the key") || plan.Ungroupable != 1 {
			t.Fatalf("plan %+v", plan.Groups)
		}
		if _, err := plan.Apply(ctx, ri.ES, ApplyOptions{BackupPath: filepath.Join(t.TempDir(), "b.ndjson")}); err != nil {
			t.Fatal(err)
		}
		if after := ri.Snapshot(t); !reflect.DeepEqual(before, after) {
			t.Fatalf("documents changed:\nbefore %v\nafter  %v", before, after)
		}
	})
}

func TestRepairIncludeMissingKeyNeedsSourceID(t *testing.T) {
	t.Parallel()
	_, err := PlanDuplicates(context.Background(), nil, Options{Index: "x", Key: []string{"canonical_url"}, IncludeMissingKey: true})
	if err == nil || !strings.Contains(err.Error(), "include_missing_key") {
		t.Fatalf("err %v, want an include_missing_key error", err)
	}
}
