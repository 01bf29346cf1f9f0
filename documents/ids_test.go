package documents_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/documents"
)

func TestIDsSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("an ids query is checked, kept when a definition is replaced without one, and audited", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.exec(t, `CREATE FUNCTION {s}.wipe() RETURNS SETOF bigint LANGUAGE sql AS 'DELETE FROM `+e.id+`.tags RETURNING tutorial_id'`)
		for _, c := range []struct{ name, sql, reason string }{
			{"two columns", `SELECT id, title FROM {s}.tutorials`, "returns 2 columns"},
			{"a parameter", `SELECT id FROM {s}.tutorials WHERE id = $1`, "uses 1 parameters"},
			{"an unknown table", `SELECT id FROM {s}.nope`, "ids_sql: PostgreSQL cannot prepare it"},
			{"a data-modifying WITH", `WITH d AS (DELETE FROM {s}.tags RETURNING tutorial_id) SELECT tutorial_id FROM d`, "ids_sql: it fails"},
			{"a writing function", `SELECT * FROM {s}.wipe()`, "ids_sql: it is not read-only"},
			{"a slow query", `SELECT 1 FROM pg_sleep(5)`, "did not come within"},
		} {
			_, err := documents.Define(ctx, e.pool, e.schema, documents.DefineOptions{Index: "tutorials", SQL: e.definition(), IDsSQL: e.sql(c.sql), Operator: "test", CheckTimeout: 300 * time.Millisecond})
			var de *documents.DefinitionError
			if !errors.As(err, &de) || !strings.Contains(err.Error(), c.reason) {
				t.Errorf("%s: %v; want a *DefinitionError saying %q", c.name, err, c.reason)
			}
		}
		ids := e.sql(`SELECT id FROM {s}.tutorials`)
		d, err := documents.Define(ctx, e.pool, e.schema, documents.DefineOptions{Index: "tutorials", SQL: e.definition(), IDsSQL: ids, Operator: "test"})
		if err != nil || d.IDsSQL != ids {
			t.Fatalf("define: %+v, %v", d, err)
		}
		d, err = documents.Define(ctx, e.pool, e.schema, documents.DefineOptions{Index: "tutorials", SQL: e.definition(), Operator: "test"})
		if err != nil || d.IDsSQL != ids || d.PreviousIDsSQL != ids || d.Revision != 2 {
			t.Fatalf("redefined without an ids query: %+v, %v; want the one declared before kept", d, err)
		}
		got, err := documents.Lookup(ctx, e.pool, e.schema, "tutorials")
		if err != nil || got == nil || got.IDsSQL != ids || got.NeedIDs() != nil {
			t.Fatalf("lookup: %+v, %v", got, err)
		}
		var n int
		if err := e.pool.QueryRow(ctx, e.sql(`SELECT count(*) FROM {s}.audit_log WHERE action = 'documents.define' AND detail->>'ids_sql' = $1`), ids).Scan(&n); err != nil || n != 2 {
			t.Fatalf("audit rows with the ids query: %d, %v", n, err)
		}
	})

	t.Run("lookup says nil for an index without a definition, and NeedIDs names the flag", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		if d, err := documents.Lookup(ctx, e.pool, e.schema, "nothing"); d != nil || err != nil {
			t.Fatalf("lookup of an undefined index: %+v, %v", d, err)
		}
		e.define(t, "tutorials")
		d, err := documents.Lookup(ctx, e.pool, e.schema, "tutorials")
		if err != nil || d == nil {
			t.Fatal(d, err)
		}
		if err := d.NeedIDs(); !errors.Is(err, documents.ErrNoIDs) || !strings.Contains(err.Error(), "--ids-sql") {
			t.Fatalf("NeedIDs: %v", err)
		}
	})
}
