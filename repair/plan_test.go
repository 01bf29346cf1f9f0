package repair

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/scan"
)

func TestRepairKeeperChoice(t *testing.T) {
	t.Parallel()
	const w = "n-000001"
	doc := func(index, id, sid string, v int64, upd string, tomb bool) scan.Doc {
		return scan.Doc{Index: index, ID: id, SourceID: sid, Version: v, Versioned: true, ESVersion: v, Updated: upd, Tombstone: tomb}
	}

	t.Run("the highest version wins", func(t *testing.T) {
		k, others, deleted, why := chooseKeeper([]scan.Doc{
			doc(w, "r1", "s", 1, "", false), doc(w, "r2", "s", 3, "", false), doc(w, "s", "s", 2, "", false),
		}, w, "updated_at")
		if k.ID != "r2" || deleted || len(others) != 2 || !strings.Contains(why, "highest version 3") {
			t.Fatalf("keeper %s deleted %v others %d why %q", k.ID, deleted, len(others), why)
		}
	})
	for _, tc := range []struct {
		name, keeper, why string
		docs              []scan.Doc
	}{
		{"a version tie goes to the newest updated-at", "r", "newest updated_at",
			[]scan.Doc{doc(w, "s", "s", 2, "2024-01-01T00:00:00Z", false), doc(w, "r", "s", 2, "2024-06-01T00:00:00Z", false)}},
		{"a full tie goes to the document at _id = source_id", "s", "_id equals source_id",
			[]scan.Doc{doc(w, "a", "s", 2, "x", false), doc(w, "s", "s", 2, "x", false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, _, _, why := chooseKeeper(tc.docs, w, "updated_at")
			if k.ID != tc.keeper || !strings.Contains(why, tc.why) {
				t.Fatalf("keeper %s why %q", k.ID, why)
			}
		})
	}
	t.Run("a newer tombstone keeps the key deleted", func(t *testing.T) {
		k, others, deleted, why := chooseKeeper([]scan.Doc{
			doc(w, "r", "s", 4, "", false), doc(w, "s", "s", 5, "", true),
		}, w, "updated_at")
		if k.ID != "s" || !deleted || len(others) != 1 || !strings.Contains(why, "stays deleted") {
			t.Fatalf("keeper %s deleted %v why %q", k.ID, deleted, why)
		}
	})
	t.Run("a tombstone tie keeps the key deleted", func(t *testing.T) {
		_, _, deleted, _ := chooseKeeper([]scan.Doc{doc(w, "r", "s", 5, "", false), doc(w, "s", "s", 5, "", true)}, w, "updated_at")
		if !deleted {
			t.Fatal("a live copy at the tombstone's version must not win")
		}
	})
	t.Run("an older tombstone never wins over a live document", func(t *testing.T) {
		k, others, deleted, _ := chooseKeeper([]scan.Doc{doc(w, "s", "s", 3, "", true), doc(w, "r", "s", 6, "", false)}, w, "updated_at")
		if k.ID != "r" || deleted || len(others) != 1 || !others[0].Tombstone {
			t.Fatalf("keeper %s deleted %v", k.ID, deleted)
		}
	})
	t.Run("a copy in the write index beats one in an older index", func(t *testing.T) {
		k, _, _, _ := chooseKeeper([]scan.Doc{doc("n-000000", "s", "s", 2, "", false), doc(w, "s", "s", 2, "", false)}, w, "updated_at")
		if k.Index != w {
			t.Fatalf("keeper in %s", k.Index)
		}
	})
}

func TestRepairPlanGroup(t *testing.T) {
	t.Parallel()
	const w = "n-000001"
	t.Run("a keeper at a random _id is rewritten over the canonical copy", func(t *testing.T) {
		g, needed := planGroup("s", []scan.Doc{
			{Index: w, ID: "s", SourceID: "s", Versioned: true, Version: 2, ESVersion: 2},
			{Index: w, ID: "r", SourceID: "s", Versioned: true, Version: 3, ESVersion: 1},
		}, w, "updated_at")
		if !needed || !g.Rewrite || g.Overwrites == nil || g.Overwrites.ID != "s" || len(g.Remove) != 1 || g.Remove[0].ID != "r" || g.Conflict != "" {
			t.Fatalf("%+v", g)
		}
	})
	t.Run("a single document in place needs nothing", func(t *testing.T) {
		if _, needed := planGroup("s", []scan.Doc{{Index: w, ID: "s", SourceID: "s", Versioned: true, Version: 1}}, w, ""); needed {
			t.Fatal("needed")
		}
	})
	t.Run("a single legacy document moves to its source_id", func(t *testing.T) {
		g, needed := planGroup("s", []scan.Doc{{Index: w, ID: "r", SourceID: "s", Versioned: true, Version: 1}}, w, "")
		if !needed || !g.Rewrite || g.Overwrites != nil || len(g.Remove) != 1 {
			t.Fatalf("%+v", g)
		}
	})
	t.Run("a target holding a higher _version is a conflict", func(t *testing.T) {
		g, _ := planGroup("s", []scan.Doc{
			{Index: w, ID: "s", SourceID: "s", Versioned: true, Version: 2, ESVersion: 9},
			{Index: w, ID: "r", SourceID: "s", Versioned: true, Version: 3, ESVersion: 1},
		}, w, "")
		if g.Conflict == "" {
			t.Fatalf("%+v", g)
		}
	})
}

func TestParseRepairKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"": "source_id", "canonical_url": "canonical_url", "a, b": "a|b"} {
		got, err := ParseKey(in)
		if err != nil || strings.Join(got, "|") != want {
			t.Errorf("ParseKey(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"a,,b", "_id"} {
		if _, err := ParseKey(bad); err == nil || !strings.HasPrefix(err.Error(), "key:") {
			t.Errorf("ParseKey(%q): want a key: error, got %v", bad, err)
		}
	}
}

func TestRepairGrouper(t *testing.T) {
	t.Parallel()
	t.Run("documents come back as they went in, grouped by key", func(t *testing.T) {
		g := newGrouper()
		in := []struct {
			key string
			doc scan.Doc
		}{
			{"s", scan.Doc{Index: "w", ID: "s", SourceID: "s", Version: 2, ESVersion: 2, SeqNo: 1, PrimaryTerm: 1, Updated: "2024-01-01T00:00:00Z"}},
			{"s", scan.Doc{Index: "w", ID: "r1", SourceID: "s", Version: 3, ESVersion: 1, SeqNo: 2, PrimaryTerm: 1, Updated: "yesterday"}},
			{"s", scan.Doc{Index: "o", ID: "s", SourceID: "s", Version: 1, ESVersion: 1, Tombstone: true}},
			{"url", scan.Doc{Index: "w", ID: "r2", SourceID: "x", Version: 1, ESVersion: 1}},
			{"alone", scan.Doc{Index: "w", ID: "alone", SourceID: "alone", Version: 1, ESVersion: 1}},
		}
		for _, x := range in {
			g.add(x.key, x.doc)
		}
		got := map[string][]scan.Doc{}
		g.each("w", func(k string, docs []scan.Doc) {
			got[k] = append([]scan.Doc(nil), docs...)
		})
		if len(got) != 2 || len(got["s"]) != 3 || len(got["url"]) != 1 {
			t.Fatalf("groups %v (a single document in place must be skipped)", got)
		}
		want := map[string]scan.Doc{}
		for _, x := range in {
			want[x.doc.Index+"/"+x.doc.ID] = x.doc
		}
		for _, docs := range got {
			for _, d := range docs {
				if w := want[d.Index+"/"+d.ID]; d != w {
					t.Errorf("got %+v, want %+v", d, w)
				}
			}
		}
		n := 0
		g.eachDoc(func(k, index, id string) { n++ })
		if n != 5 {
			t.Errorf("eachDoc saw %d documents, want 5", n)
		}
	})
}
