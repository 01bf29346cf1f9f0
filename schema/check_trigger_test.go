package schema_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/schema/schematest"
)

// The event rules live in the outboxd_check trigger (migration 42); the
// automatic version stays append's own first write.
func TestCheckTrigger(t *testing.T) {
	t.Parallel()

	t.Run("only append hands out automatic versions; a direct INSERT or COPY without one is refused", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		exec(t, e.pool, `SELECT `+e.ident+`.append('items', 'a', NULL, 'upsert', '{}')`)
		if _, err := e.pool.Exec(ctx, `INSERT INTO `+e.ident+`.events (index_name, source_id, op, document) VALUES ('items', 'a', 'upsert', '{}')`); err == nil || !strings.Contains(err.Error(), "version") {
			t.Fatalf("a direct INSERT without a version: %v, want a refusal naming version", err)
		}
		if _, err := e.pool.CopyFrom(ctx, pgx.Identifier{e.name, "events"}, []string{"index_name", "source_id", "op"},
			pgx.CopyFromRows([][]any{{"items", "a", "delete"}})); err == nil || !strings.Contains(err.Error(), "version") {
			t.Fatalf("a COPY without a version: %v, want a refusal naming version", err)
		}
		exec(t, e.pool, `SELECT `+e.ident+`.append('items', 'b', NULL, 'delete', NULL)`)
		exec(t, e.pool, `SELECT `+e.ident+`.append('items', 'a', NULL, 'upsert', '{}')`)
		rows, err := e.pool.Query(ctx, `SELECT source_id || ':' || version FROM `+e.ident+`.events ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, " ") != "a:1 b:1 a:2" {
			t.Fatalf("versions %v, want a:1 b:1 a:2", got)
		}
	})

	t.Run("a refused event uses up no version", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		// append takes the counter first; the trigger's refusal rolls it back.
		_, err := e.pool.Exec(ctx, `SELECT `+e.ident+`.append('items', 'a', NULL, 'upsert', '[1]')`)
		if err == nil || !mentionsField(err.Error(), "document") {
			t.Fatalf("an upsert of an array: %v, want a document refusal", err)
		}
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.ident+`.versions`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d counter rows after a refused event, %v", n, err)
		}
	})

	t.Run("append refuses a bad event with its own reason before taking a counter", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		for _, c := range []struct{ call, field, reason string }{
			{`append('items', NULL, NULL, 'upsert', '{}')`, "source_id", "must not be empty"},
			{`append('items', repeat('x', 600), NULL, 'upsert', '{}')`, "source_id", "bytes"},
			{`append(NULL, 'a', NULL, 'upsert', '{}')`, "index_name", ""},
			{`append('items', 'a', NULL, 'delete', '{}')`, "document", "a delete must not carry a document"},
		} {
			_, err := e.pool.Exec(ctx, `SELECT `+e.ident+`.`+c.call)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "22023" || !mentionsField(err.Error(), c.field) || !strings.Contains(err.Error(), c.reason) {
				t.Errorf("%s: %v, want SQLSTATE 22023 naming %s (%q)", c.call, err, c.field, c.reason)
			}
		}
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.ident+`.versions`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d counter rows after refused events, %v", n, err)
		}
	})

	t.Run("a COPY is held to the rules, naming the field", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		_, err := e.pool.CopyFrom(t.Context(), pgx.Identifier{e.name, "events"}, []string{"index_name", "source_id", "version", "op"},
			pgx.CopyFromRows([][]any{{"items", "ok", 1, "delete"}, {"items", "", 1, "delete"}}))
		if err == nil || !mentionsField(err.Error(), "source_id") {
			t.Fatalf("COPY of an event without a source_id: %v, want a source_id refusal", err)
		}
		if n := e.count(t, `true`); n != 0 {
			t.Fatalf("%d events written by a refused COPY", n)
		}
	})

	t.Run("the rules hold under session_replication_role = replica and for an UPDATE", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+e.ident+`.events (index_name, source_id, version, op) VALUES ('Items', 'a', 1, 'delete')`)
			return err
		})
		if err == nil || !mentionsField(err.Error(), "index_name") {
			t.Fatalf("a bad index name from a replica-role session: %v, want an index_name refusal", err)
		}
		exec(t, e.pool, `SELECT `+e.ident+`.append('items', 'a', 1, 'delete', NULL)`)
		_, err = e.pool.Exec(ctx, `UPDATE `+e.ident+`.events SET document = '{"a": 1}'`)
		if err == nil || !mentionsField(err.Error(), "document") {
			t.Fatalf("an UPDATE giving a delete a document: %v, want a document refusal", err)
		}
	})
}

// exec runs sql on pool and fails the test on an error.
func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// migrateBefore creates schema name as the migrations before version v
// leave it, as an outbox deployed before v would be.
func migrateBefore(t *testing.T, pool *pgxpool.Pool, name string, v int) {
	t.Helper()
	ctx := t.Context()
	id := pgx.Identifier{name}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+id+`; CREATE TABLE `+id+`.schema_migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Version >= v {
			break
		}
		sql, err := schema.Render(m.SQL, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		exec(t, pool, `INSERT INTO `+id+`.schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
	}
}

func TestMigrateToCheckTrigger(t *testing.T) {
	t.Parallel()

	t.Run("upgrading an outbox in place keeps its events and counters, and the rules still hold", func(t *testing.T) {
		t.Parallel()
		pool := schematest.Pool(t)
		name := newSchema(t, pool, schematest.Name("t_ck_"))
		id := pgx.Identifier{name}.Sanitize()
		ctx := t.Context()
		migrateBefore(t, pool, name, 42)
		exec(t, pool, `SELECT `+id+`.append('items', 'a', NULL, 'upsert', '{"n": 1}')`)
		exec(t, pool, `SELECT `+id+`.append('items', 'a', NULL, 'upsert', '{"n": 2}', 'item.updated', '{"trace": "t"}')`)
		exec(t, pool, `SELECT `+id+`.append('items', 'b', 7, 'delete', NULL)`)
		exec(t, pool, `SELECT `+id+`.append_message('hooks', 'key-1', '{"m": 1}')`)
		digest := func() string {
			var d string
			if err := pool.QueryRow(ctx, `SELECT md5(string_agg(to_jsonb(e)::text, ',' ORDER BY id)) FROM `+id+`.events e`).Scan(&d); err != nil {
				t.Fatal(err)
			}
			return d
		}
		before := digest()

		done, err := schema.Migrate(ctx, pool, name)
		if err != nil {
			t.Fatal(err)
		}
		if len(done) == 0 || done[0] != 42 {
			t.Fatalf("applied %v, want 42 first", done)
		}
		if after := digest(); after != before {
			t.Fatal("the events changed in the upgrade")
		}
		var eid, v int64
		if err := pool.QueryRow(ctx, `SELECT `+id+`.append('items', 'a', NULL, 'delete', NULL)`).Scan(&eid); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT version FROM `+id+`.events WHERE id = $1`, eid).Scan(&v); err != nil || v != 3 {
			t.Fatalf("the next automatic version of items/a: %d, %v; want 3", v, err)
		}
		_, err = pool.Exec(ctx, `INSERT INTO `+id+`.events (index_name, source_id, version, op) VALUES ('x-read', 'c', 1, 'delete')`)
		if err == nil || !strings.Contains(err.Error(), "index_name:") || !strings.Contains(err.Error(), "reserves") {
			t.Fatalf("a reserved index name after the upgrade: %v, want an index_name refusal with its reason", err)
		}
		var checks int
		var enabled string
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c'),
				(SELECT tgenabled::text FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = 'outboxd_check')`, id+".events").Scan(&checks, &enabled); err != nil {
			t.Fatal(err)
		}
		if checks != 0 || enabled != "A" {
			t.Fatalf("%d CHECK constraints left, trigger enabled %q; want 0 and A (always)", checks, enabled)
		}
	})

	t.Run("the upgrade gives up after lock_timeout instead of queueing writers behind an open transaction", func(t *testing.T) {
		t.Parallel()
		pool := schematest.Pool(t)
		name := newSchema(t, pool, schematest.Name("t_ckl_"))
		id := pgx.Identifier{name}.Sanitize()
		ctx := t.Context()
		migrateBefore(t, pool, name, 42)
		holder, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(context.Background())
		if _, err := holder.Exec(ctx, `SELECT `+id+`.append('items', 'open', 1, 'delete', NULL)`); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = schema.Migrate(ctx, pool, name)
		if err == nil || !strings.Contains(err.Error(), "lock timeout") {
			t.Fatalf("upgrade while a writer holds events: %v, want a lock timeout", err)
		}
		// The bound, not a performance assertion: 5 s of lock_timeout.
		if took := time.Since(start); took > time.Minute {
			t.Fatalf("the refused upgrade took %s", took)
		}
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if done, err := schema.Migrate(ctx, pool, name); err != nil || len(done) == 0 {
			t.Fatalf("upgrade after the writer committed: %v, %v", done, err)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+id+`.events WHERE source_id = 'open'`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%d events of the open writer, %v; want 1", n, err)
		}
	})
}
