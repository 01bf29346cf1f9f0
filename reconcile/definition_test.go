package reconcile

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// README, "Documents from several tables": reconcile without --source-sql takes
// the definition as the truth, and --apply fixes drift with refreshes.
func TestReconcileDefinition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("the definition is the truth: missing, stale and extra documents are found and fixed by refreshes the relay delivers", func(t *testing.T) {
		t.Parallel()
		d := tooltest.NewDocs(t, 8)
		live := d.Sink(t, nil)
		for id := 1; id <= 8; id++ {
			estest.MustWrite(t, live, outbox.Event{ID: 1, IndexName: d.Name, SourceID: reconItoa(int64(id)), Version: 1, Op: outbox.OpRefresh})
		}
		if dr := d.Drift(t); !dr.Zero() {
			t.Fatalf("before: %s", dr)
		}
		// Changes whose refreshes the relay (not running) has not
		// delivered, a document lost from the index and one the
		// definition never returned.
		d.Exec(t, `UPDATE {s}.tutorials SET title = 'edited' WHERE id = 3; DELETE FROM {s}.tutorials WHERE id = 4;
			INSERT INTO {s}.tutorials (id, title, author_id) VALUES (9, 'new', 1)`)
		estest.Must(t, d.ES, "DELETE", "/"+indexer.WriteAlias(d.Name)+"/_doc/2", "")
		estest.Must(t, d.ES, "PUT", "/"+indexer.WriteAlias(d.Name)+"/_doc/99?version=1&version_type=external", `{"title":"stray"}`)
		estest.Refresh(t, d.ES, d.Name)
		events := func() int {
			var n int
			if err := d.Pool.QueryRow(ctx, d.SQL(`SELECT count(*) FROM {s}.events`)).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := events()

		o := Options{ES: d.ES, DB: d.Pool, Schema: d.Schema, Index: d.Name}
		rep, err := Run(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{DriftMissing: 2, DriftStale: 1, DriftExtra: 2, DriftResurrected: 0, DriftDuplicate: 0, DriftAhead: 0}
		if !reflect.DeepEqual(rep.Counts, want) || rep.Events != 5 || rep.SourceRows != 8 || events() != before {
			t.Fatalf("dry run: %+v; want counts %v, 5 fixes, 8 documents, nothing appended", rep, want)
		}
		var got []string
		for _, k := range []string{DriftMissing, DriftStale, DriftExtra} {
			for _, s := range rep.Samples[k] {
				got = append(got, k+" "+s.SourceID)
			}
		}
		slices.Sort(got)
		if w := []string{"extra 4", "extra 99", "missing 2", "missing 9", "stale 3"}; !slices.Equal(got, w) {
			t.Fatalf("samples %q, want %q", got, w)
		}

		o.Apply, o.Operator = true, "tester"
		if rep, err = Run(ctx, o); err != nil || rep.Events != 5 {
			t.Fatalf("apply: %+v, %v", rep, err)
		}
		var refreshes, audits int
		if err := d.Pool.QueryRow(ctx, d.SQL(`SELECT (SELECT count(*) FROM {s}.events WHERE id > $1 AND op = 'refresh'),
			(SELECT count(*) FROM {s}.audit_log WHERE action = 'reconcile.apply' AND operator = 'tester')`), before).Scan(&refreshes, &audits); err != nil || refreshes != 5 || audits != 1 {
			t.Fatalf("apply appended %d refreshes and %d audit rows (%v); want 5 and 1", refreshes, audits, err)
		}
		d.StartRelay(t)
		d.WaitBacklog(t)
		if dr := d.Drift(t); !dr.Zero() {
			t.Fatalf("after the relay delivered the fixes: %s", dr)
		}
		if doc := tooltest.IndexDocs(t, d.ES, d.Name)["99"]; !doc.Deleted {
			t.Fatalf("the stray document: %s; want a tombstone", doc.Source)
		}
		again, err := Run(ctx, Options{ES: d.ES, DB: d.Pool, Schema: d.Schema, Index: d.Name})
		if err != nil || again.Drifted() || again.Events != 0 {
			t.Fatalf("again: %+v, %v; want no drift", again, err)
		}
	})

	t.Run("what cannot be compared is refused with the field and the reason", func(t *testing.T) {
		t.Parallel()
		d := tooltest.NewDocs(t, 1)
		estest.MustWrite(t, d.Sink(t, nil), outbox.Event{ID: 1, IndexName: d.Name, SourceID: "1", Version: 1, Op: outbox.OpRefresh})
		pool, bare := schematest.Setup(t)
		for _, c := range []struct {
			name string
			o    Options
			want string
		}{
			{"no definition and no query", Options{ES: d.ES, DB: pool, Schema: bare, Index: d.Name}, "source_sql: required: index " + d.Name + " has no document definition"},
			{"a query for a definition-fed index", Options{ES: d.ES, DB: d.Pool, Schema: d.Schema, Index: d.Name, SourceSQL: d.SQL(`SELECT id::text, 1, '{}'::jsonb FROM {s}.tutorials`)}, "is definition-fed"},
			{"a version field", Options{ES: d.ES, DB: d.Pool, Schema: d.Schema, Index: d.Name, VersionField: "v"}, "version_field: index " + d.Name + " is definition-fed"},
		} {
			if _, err := Run(ctx, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v; want %q", c.name, err, c.want)
			}
		}
		if _, err := documents.Define(ctx, d.Pool, d.Schema, documents.DefineOptions{Index: d.Name, SQL: d.Definition(), Operator: "test"}); err != nil {
			t.Fatal(err)
		}
		d.Exec(t, `UPDATE {s}.documents SET ids_sql = NULL`)
		if _, err := Run(ctx, Options{ES: d.ES, DB: d.Pool, Schema: d.Schema, Index: d.Name}); !errors.Is(err, documents.ErrNoIDs) {
			t.Errorf("a definition without an ids query: %v", err)
		}
	})
}
