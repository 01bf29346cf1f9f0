package documents_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/outbox"
)

func TestDefine(t *testing.T) {
	t.Parallel()

	t.Run("a definition is stored with who and when, and a new one keeps the previous SQL, both audited", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := context.Background()
		d, err := documents.Define(ctx, e.pool, e.schema, documents.DefineOptions{Index: "tutorials", SQL: e.definition(), Operator: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Revision != 1 || d.DefinedBy != "alice" || d.PreviousSQL != "" {
			t.Fatalf("first definition: %+v", d)
		}
		second := strings.Replace(e.definition(), "'title', t.title", "'name', t.title", 1)
		d, err = documents.Define(ctx, e.pool, e.schema, documents.DefineOptions{Index: "tutorials", SQL: second, Operator: "bob"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Revision != 2 || d.DefinedBy != "bob" || d.PreviousSQL != e.definition() || d.PreviousBy != "alice" || d.PreviousAt == nil {
			t.Fatalf("second definition: %+v", d)
		}
		defs, err := documents.List(ctx, e.pool, e.schema)
		if err != nil || len(defs) != 1 || defs[0].SQL != second || defs[0].PreviousSQL != e.definition() {
			t.Fatalf("list: %+v, %v", defs, err)
		}
		var n int
		var prev string
		if err := e.pool.QueryRow(ctx, e.sql(`SELECT count(*), max(detail->>'previous_sql') FROM {s}.audit_log WHERE action = 'documents.define' AND detail->>'index' = 'tutorials'`)).Scan(&n, &prev); err != nil || n != 2 || prev != e.definition() {
			t.Fatalf("audit: %d rows, previous %q, %v", n, prev, err)
		}
	})

	t.Run("a definition that cannot work is refused with the reason", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'); INSERT INTO {s}.tutorials VALUES (1, 'go', 1)`)
		for _, c := range []struct{ name, sql, reason string }{
			{"a syntax error", `SELEC t.id::text FROM {s}.tutorials t`, "cannot prepare it"},
			{"an unknown table", `SELECT id::text, '{}'::jsonb FROM {s}.nope WHERE id::text = ANY($1)`, "cannot prepare it"},
			{"no $1", `SELECT t.id::text, '{}'::jsonb FROM {s}.tutorials t`, "does not use $1"},
			{"a second parameter", `SELECT t.id::text, '{}'::jsonb FROM {s}.tutorials t WHERE t.id::text = ANY($1) AND t.title = $2`, "2 parameters"},
			{"$1 as bigint[]", `SELECT t.id::text, '{}'::jsonb FROM {s}.tutorials t WHERE t.id = ANY($1)`, "$1 is used as bigint[]"},
			{"three columns", `SELECT t.id::text, '{}'::jsonb, t.title FROM {s}.tutorials t WHERE t.id::text = ANY($1)`, "returns 3 columns"},
			{"one column", `SELECT t.id::text FROM {s}.tutorials t WHERE t.id::text = ANY($1)`, "returns 1 columns"},
			{"an id that is not text", `SELECT t.id, '{}'::jsonb FROM {s}.tutorials t WHERE t.id::text = ANY($1)`, `first column "id" is bigint, it must be text`},
			{"a json document", `SELECT t.id::text, '{}'::json FROM {s}.tutorials t WHERE t.id::text = ANY($1)`, "second column \"json\" is json, it must be jsonb"},
			{"a writing definition", `WITH d AS (DELETE FROM {s}.tags RETURNING 1) SELECT t.id::text, '{}'::jsonb FROM {s}.tutorials t WHERE t.id::text = ANY($1)`, "not read-only"},
			{"a slow definition", `SELECT s.id, '{}'::jsonb FROM (SELECT 'x'::text AS id, pg_sleep(5) AS z) s WHERE s.z IS NOT NULL OR s.id = ANY($1)`, "did not finish within"},
			{"rows for no id", `SELECT t.id::text, '{}'::jsonb FROM {s}.tutorials t WHERE t.id::text = ANY($1) OR true`, "returns 1 rows for an empty id list"},
			{"two statements", `SELECT t.id::text, '{}'::jsonb FROM {s}.tutorials t WHERE t.id::text = ANY($1); SELECT 1`, "cannot prepare it"},
			{"an empty SQL", ` `, "sql: is empty"},
		} {
			_, err := documents.Define(context.Background(), e.pool, e.schema, documents.DefineOptions{
				Index: "tutorials", SQL: e.sql(c.sql), Operator: "test", CheckTimeout: 300 * time.Millisecond,
			})
			var de *documents.DefinitionError
			if !errors.As(err, &de) || !strings.Contains(err.Error(), c.reason) || !strings.Contains(err.Error(), "index tutorials") {
				t.Errorf("%s: %v; want a *DefinitionError saying %q", c.name, err, c.reason)
			}
		}
		if defs, err := documents.List(context.Background(), e.pool, e.schema); err != nil || len(defs) != 0 {
			t.Fatalf("refused definitions were stored: %+v, %v", defs, err)
		}
		_, err := documents.Define(context.Background(), e.pool, e.schema, documents.DefineOptions{Index: "x-read", SQL: e.definition(), Operator: "test"})
		if err == nil || !strings.Contains(err.Error(), "index_name") {
			t.Fatalf("a reserved index name: %v", err)
		}
	})

	t.Run("an index with upsert events is refused as event-fed", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.exec(t, `SELECT {s}.append('tutorials', '1', NULL, 'upsert', '{"a":1}')`)
		_, err := documents.Define(context.Background(), e.pool, e.schema, documents.DefineOptions{Index: "tutorials", SQL: e.definition(), Operator: "test"})
		if !errors.Is(err, documents.ErrEventFed) || !strings.Contains(err.Error(), "1 upsert/delete events") {
			t.Fatalf("define over an event-fed index: %v", err)
		}
	})

	t.Run("a defined index refuses upserts and deletes on every path, and an undefined one refuses refreshes", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.define(t, "tutorials")
		ctx := context.Background()
		ob, err := outbox.NewOutbox(e.schema)
		if err != nil {
			t.Fatal(err)
		}
		refused := func(what string, f func(tx pgx.Tx) error, want string) {
			t.Helper()
			err := pgx.BeginFunc(ctx, e.pool, f)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v; want an error saying %q", what, err, want)
			}
		}
		const fed = "is definition-fed"
		refused("SQL append upsert", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, e.sql(`SELECT {s}.append('tutorials', '1', NULL, 'upsert', '{"a":1}')`))
			return err
		}, fed)
		refused("SQL append delete", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, e.sql(`SELECT {s}.append('tutorials', '1', 3, 'delete', NULL)`))
			return err
		}, fed)
		refused("Go Append", func(tx pgx.Tx) error {
			_, err := ob.Append(ctx, tx, outbox.Event{IndexName: "tutorials", SourceID: "1", Version: 2, Op: outbox.OpUpsert, Document: json.RawMessage(`{"a":1}`)})
			return err
		}, fed)
		refused("AppendBatch", func(tx pgx.Tx) error {
			_, err := ob.AppendBatch(ctx, tx, []outbox.Event{{IndexName: "tutorials", SourceID: "1", Version: 2, Op: outbox.OpUpsert, Document: json.RawMessage(`{"a":1}`)}})
			return err
		}, fed)
		refused("capture", func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, e.sql(`SELECT {s}.capture('{s}.authors', 'tutorials', 'id')`)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, e.sql(`INSERT INTO {s}.authors VALUES (9, 'x')`))
			return err
		}, fed)
		refused("SQL refresh of an undefined index", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, e.sql(`SELECT {s}.refresh('other', '1')`))
			return err
		}, "has no document definition")
		refused("Go Refresh of an undefined index", func(tx pgx.Tx) error {
			_, err := ob.Refresh(ctx, tx, "other", "1")
			return err
		}, "has no document definition")
		refused("a direct INSERT of a refresh of an undefined index", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, e.sql(`INSERT INTO {s}.events (index_name, source_id, version, op) VALUES ('other', '1', 1, 'refresh')`))
			return err
		}, "has no document definition")
		refused("a refresh with a document", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, e.sql(`INSERT INTO {s}.events (index_name, source_id, version, op, document) VALUES ('tutorials', '1', 1, 'refresh', '{}')`))
			return err
		}, "document: refresh must not carry one")
		refused("Go Refresh with an empty id", func(tx pgx.Tx) error {
			_, err := ob.Refresh(ctx, tx, "tutorials", "")
			return err
		}, "source_id: must not be empty")
		// Other indexes are untouched by the guard.
		if _, err := e.pool.Exec(ctx, e.sql(`SELECT {s}.append('other', '1', NULL, 'upsert', '{"a":1}')`)); err != nil {
			t.Fatalf("an event-fed index next to a defined one: %v", err)
		}
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if _, err := ob.Refresh(ctx, tx, "tutorials", "1"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, e.sql(`SELECT {s}.refresh('tutorials', '2')`))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if got, _ := e.refreshes(t, 0); strings.Join(got, " ") != "tutorials/1 tutorials/2" {
			t.Fatalf("refreshes: %v", got)
		}
	})

	t.Run("dropping the last definition removes its watches and the guard", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := context.Background()
		e.define(t, "tutorials")
		e.watchAll(t, "tutorials")
		if err := documents.Drop(ctx, e.pool, e.schema, "tutorials", "carol"); err != nil {
			t.Fatal(err)
		}
		var triggers int
		// outboxd_check holds the outbox's own rules on every event: not the guard's.
		if err := e.pool.QueryRow(ctx, e.sql(`SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'outboxd_%' AND tgname <> 'outboxd_check' AND tgrelid IN ('{s}.tutorials'::regclass, '{s}.tags'::regclass, '{s}.authors'::regclass, '{s}.events'::regclass)`)).Scan(&triggers); err != nil || triggers != 0 {
			t.Fatalf("%d outboxd triggers left, %v", triggers, err)
		}
		// Writes to the watched tables no longer refresh, and the index
		// takes events again.
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'); SELECT {s}.append('tutorials', '1', NULL, 'upsert', '{"a":1}')`)
		if err := documents.Drop(ctx, e.pool, e.schema, "tutorials", "carol"); !errors.Is(err, documents.ErrNotDefined) {
			t.Fatalf("dropping again: %v", err)
		}
		var sql string
		if err := e.pool.QueryRow(ctx, e.sql(`SELECT detail->>'sql' FROM {s}.audit_log WHERE action = 'documents.drop' AND operator = 'carol'`)).Scan(&sql); err != nil || sql != e.definition() {
			t.Fatalf("drop audit: %q, %v", sql, err)
		}
	})
}
