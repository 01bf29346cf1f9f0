package repair

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
)

// seedDuplicates writes the duplicate cases repair handles into a two-index family:
//
//	s1  the same source_id under random _ids, versions 1, 3 and 2 (legacy)
//	s2  a live duplicate whose newer copy (at _id s2) is a tombstone
//	s3  copies across both indices; the one in the old index is newer
//	s4  a duplicate that the test modifies between Plan and Apply
//	s5  one document in place: nothing to do
//	s6  a version tie broken by updated_at
func seedDuplicates(t *testing.T, ri *tooltest.Family) {
	t.Helper()
	w, o := ri.Write, ri.Old
	ri.Put(t, w, "r1a", 0, `{"source_id":"s1","version":1,"title":"v1"}`)
	ri.Put(t, w, "r1b", 0, `{"source_id":"s1","version":3,"title":"v3"}`)
	ri.Put(t, o, "r1c", 0, `{"source_id":"s1","version":2,"title":"v2"}`)

	ri.Put(t, w, "s2", 5, estest.Tombstone)
	ri.Put(t, w, "r2", 0, `{"source_id":"s2","version":4,"title":"live"}`)

	ri.Put(t, w, "s3", 6, `{"title":"w6"}`)
	ri.Put(t, o, "s3", 7, `{"source_id":"s3","version":7,"title":"o7"}`)

	ri.Put(t, w, "s4", 2, `{"title":"canonical"}`)
	ri.Put(t, w, "r4", 0, `{"source_id":"s4","version":1,"title":"legacy"}`)

	ri.Put(t, w, "s5", 1, `{"title":"fine"}`)

	ri.Put(t, w, "r6a", 0, `{"source_id":"s6","version":2,"updated_at":"2024-01-01T00:00:00Z","title":"jan"}`)
	ri.Put(t, w, "r6b", 0, `{"source_id":"s6","version":2,"updated_at":"2024-06-01T00:00:00Z","title":"jun"}`)
	ri.Refresh(t)
}

func TestRepair(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setup := func(t *testing.T) (*tooltest.Family, map[string]tooltest.SnapDoc, *Plan) {
		ri := tooltest.NewFamily(t, true)
		seedDuplicates(t, ri)
		before := ri.Snapshot(t)
		plan, err := PlanDuplicates(ctx, ri.ES, Options{Index: ri.Name, PageSize: 3})
		if err != nil {
			t.Fatal(err)
		}
		return ri, before, plan
	}

	t.Run("a dry run plans every case and changes nothing", func(t *testing.T) {
		t.Parallel()
		ri, before, plan := setup(t)
		var out strings.Builder
		if err := plan.WriteText(&out); err != nil {
			t.Fatal(err)
		}
		t.Log("\n" + out.String())
		if after := ri.Snapshot(t); !reflect.DeepEqual(before, after) {
			t.Fatalf("the dry run changed documents:\nbefore %v\nafter  %v", before, after)
		}
		keepers := map[string]string{}
		for _, g := range plan.Groups {
			keepers[g.Key] = g.Keeper.Index + "/" + g.Keeper.ID
		}
		want := map[string]string{
			"s1": ri.Write + "/r1b", "s2": ri.Write + "/s2", "s3": ri.Old + "/s3",
			"s4": ri.Write + "/s4", "s6": ri.Write + "/r6b",
		}
		if !reflect.DeepEqual(keepers, want) {
			t.Fatalf("keepers %v, want %v", keepers, want)
		}
		s := plan.Summary()
		if s.Scanned != 12 || s.Keys != 6 || s.Groups != 5 || s.Deleted != 1 || s.Remove != 8 || s.Rewrite != 3 || s.Create != 2 {
			t.Fatalf("summary %+v", s)
		}
		if !strings.Contains(out.String(), "stays deleted") {
			t.Error("the plan does not say why the tombstone wins")
		}
	})

	t.Run("apply leaves one document per key, skips the concurrently modified one, and restore undoes it", func(t *testing.T) {
		t.Parallel()
		ri, before, plan := setup(t)
		dir := t.TempDir()
		backup := filepath.Join(dir, "backup.ndjson")
		audit, err := OpenAuditLog(filepath.Join(dir, "audit.jsonl"), "tester")
		if err != nil {
			t.Fatal(err)
		}

		// A writer changes r4 after the scan.
		ri.Put(t, ri.Write, "r4", 0, `{"source_id":"s4","version":1,"title":"legacy, edited"}`)
		modified := ri.Snapshot(t)

		res, err := plan.Apply(ctx, ri.ES, ApplyOptions{BackupPath: backup, Audit: audit, Operator: "tester", Batch: 4})
		if err != nil {
			t.Fatal(err)
		}
		if err := audit.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("result %+v", res)
		if len(res.Skipped) != 1 || res.Skipped[0].ID != "r4" || !strings.Contains(res.Skipped[0].Reason, "changed since the scan") {
			t.Fatalf("skipped %+v, want only r4 as changed since the scan", res.Skipped)
		}
		if res.Rewritten != 3 || res.Created != 2 || res.Removed != 7 || res.Groups != 4 {
			t.Fatalf("result %+v", res)
		}

		after := ri.Snapshot(t)
		w := ri.Write
		want := map[string]string{
			w + "/s1": `{"source_id":"s1","version":3,"title":"v3"}`,
			w + "/s2": estest.Tombstone,
			w + "/s3": `{"source_id":"s3","version":7,"title":"o7"}`,
			w + "/s4": `{"title":"canonical"}`,
			w + "/r4": `{"source_id":"s4","version":1,"title":"legacy, edited"}`,
			w + "/s5": `{"title":"fine"}`,
			w + "/s6": `{"source_id":"s6","version":2,"updated_at":"2024-06-01T00:00:00Z","title":"jun"}`,
		}
		got := map[string]string{}
		for k, d := range after {
			got[k] = d.Source
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("after apply:\n got %v\nwant %v", got, want)
		}
		for id, v := range map[string]int64{"s1": 3, "s2": 5, "s3": 7} {
			if d := after[w+"/"+id]; d.Version != v {
				t.Errorf("%s at _version %d, want %d", id, d.Version, v)
			}
		}
		if vis := ri.Visible(t); strings.Contains(strings.Join(vis, ","), "/s2") || strings.Contains(strings.Join(vis, ","), "r2") {
			t.Errorf("the deleted key is visible: %v", vis)
		}

		lines := readLines(t, filepath.Join(dir, "audit.jsonl"))
		actions := map[string]int{}
		for _, l := range lines {
			var e AuditEntry
			if err := json.Unmarshal([]byte(l), &e); err != nil {
				t.Fatal(err)
			}
			if e.Operator != "tester" || e.Time.IsZero() {
				t.Errorf("audit entry lacks operator or time: %s", l)
			}
			actions[e.Action]++
		}
		if actions["repair.start"] != 1 || actions["repair.group"] != 5 || actions["repair.finish"] != 1 {
			t.Errorf("audit actions %v", actions)
		}

		rres, err := Restore(ctx, ri.ES, backup, RestoreOptions{Batch: 3})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("restore %+v", rres)
		if len(rres.Skipped) != 0 || rres.Removed != 2 {
			t.Fatalf("restore %+v", rres)
		}
		restored := ri.Snapshot(t)
		if !reflect.DeepEqual(sourcesOf(restored), sourcesOf(modified)) {
			t.Fatalf("restore did not bring back the original set:\n got %v\nwant %v", sourcesOf(restored), sourcesOf(modified))
		}
		// Versions come back exactly where Elasticsearch allows it, and are
		// never lower than they were.
		for k, d := range restored {
			if d.Version < before[k].Version {
				t.Errorf("%s restored at _version %d, below the original %d", k, d.Version, before[k].Version)
			}
		}
	})

	t.Run("apply refuses to start when the backup cannot be written", func(t *testing.T) {
		t.Parallel()
		ri, before, plan := setup(t)
		_, err := plan.Apply(ctx, ri.ES, ApplyOptions{BackupPath: filepath.Join(t.TempDir(), "missing-dir", "b.ndjson")})
		if err == nil || !strings.Contains(err.Error(), "nothing was changed") {
			t.Fatalf("err %v", err)
		}
		if after := ri.Snapshot(t); !reflect.DeepEqual(before, after) {
			t.Fatal("documents changed although the backup failed")
		}
	})

	t.Run("canonical_url twins keep the newest and leave documents without a url alone", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, false)
		w := ri.Write
		ri.Put(t, w, "u1", 1, `{"canonical_url":"https://x/a","title":"first"}`)
		ri.Put(t, w, "u2", 2, `{"canonical_url":"https://x/a","title":"second"}`)
		ri.Put(t, w, "u3", 1, `{"canonical_url":"https://x/b"}`)
		ri.Put(t, w, "u4", 1, `{"title":"no url"}`)
		ri.Refresh(t)
		plan, err := PlanDuplicates(ctx, ri.ES, Options{Index: ri.Name, Key: []string{"canonical_url"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(plan.Groups) != 1 || plan.Groups[0].Keeper.ID != "u2" || len(plan.Groups[0].Remove) != 1 || plan.Groups[0].Rewrite || plan.Ungroupable != 1 {
			t.Fatalf("plan %+v", plan)
		}
		if _, err := plan.Apply(ctx, ri.ES, ApplyOptions{BackupPath: filepath.Join(t.TempDir(), "b.ndjson")}); err != nil {
			t.Fatal(err)
		}
		got := ri.Visible(t)
		if want := []string{w + "/u2", w + "/u3", w + "/u4"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("visible %v, want %v", got, want)
		}
	})

	t.Run("a filtered alias is refused", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, false)
		_, err := PlanDuplicates(ctx, ri.ES, Options{Index: ri.Name + "-read"})
		if err == nil || !strings.Contains(err.Error(), "filtered alias") {
			t.Fatalf("err %v", err)
		}
	})
}

func sourcesOf(s map[string]tooltest.SnapDoc) map[string]string {
	out := map[string]string{}
	for k, d := range s {
		out[k] = d.Source
	}
	return out
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}
