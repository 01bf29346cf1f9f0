package schema_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/schema/schematest"
)

// env is one freshly migrated outbox schema on the shared server.
type env struct {
	pool  *pgxpool.Pool
	name  string // unquoted schema name
	ident string // quoted, ready for SQL
}

func setup(t *testing.T) *env {
	t.Helper()
	pool, name := schematest.Setup(t)
	id, err := schema.Ident(name)
	if err != nil {
		t.Fatal(err)
	}
	return &env{pool: pool, name: name, ident: id}
}

func (e *env) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+e.ident+`.events WHERE `+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// mentionsField reports whether msg names field the way outboxd's errors
// (and its CHECK constraint names) do, or the way a NOT NULL violation does.
func mentionsField(msg, field string) bool {
	return strings.Contains(msg, field+":") || strings.Contains(msg, `column "`+field+`"`)
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// badEvent is one append call the outbox must refuse, with the field its
// error has to name. nil means SQL NULL.
type badEvent struct {
	name                           string
	field                          string
	index, source, op, doc, header any
	version                        any
}

func badEvents() []badEvent {
	ok := func(b badEvent) badEvent {
		if b.index == nil && b.field != "index_name" {
			b.index = "items"
		}
		if b.source == nil && b.field != "source_id" {
			b.source = "s1"
		}
		if b.version == nil && b.field != "version" {
			b.version = int64(1)
		}
		if b.op == nil && b.field != "op" {
			b.op = "upsert"
		}
		if b.doc == nil && b.field != "document" && b.op == "upsert" {
			b.doc = `{"a":1}`
		}
		return b
	}
	cases := []badEvent{
		{name: "a NULL source_id", field: "source_id"},
		{name: "an empty source_id", field: "source_id", source: ""},
		{name: "a source_id of 513 bytes", field: "source_id", source: strings.Repeat("x", 513)},
		{name: "version 0", field: "version", version: int64(0)},
		{name: "version -1", field: "version", version: int64(-1)},
		{name: "op merge", field: "op", op: "merge"},
		{name: "a NULL op", field: "op"},
		{name: "an upsert with a NULL document", field: "document"},
		{name: "an upsert with a JSON array", field: "document", doc: `[1,2]`},
		{name: "an upsert with a JSON string", field: "document", doc: `"text"`},
		{name: "an upsert with JSON null", field: "document", doc: `null`},
		{name: "a delete with a document", field: "document", op: "delete", doc: `{"a":1}`},
		{name: "headers that are not an object", field: "headers", header: `["trace"]`},
		{name: "a NULL index name", field: "index_name"},
		{name: "an empty index name", field: "index_name", index: ""},
		{name: "an uppercase index name", field: "index_name", index: "Tutorials"},
		{name: "an index name starting with _", field: "index_name", index: "_x"},
		{name: "an index name starting with -", field: "index_name", index: "-x"},
		{name: "an index name starting with +", field: "index_name", index: "+x"},
		{name: "an index name of 256 bytes", field: "index_name", index: strings.Repeat("i", 256)},
		{name: "the index name .", field: "index_name", index: "."},
		{name: "the index name ..", field: "index_name", index: ".."},
		{name: "an index name starting with .", field: "index_name", index: ".x"},
		{name: "an index name of 249 bytes", field: "index_name", index: strings.Repeat("i", 249)},
		{name: "an index name with a non-ASCII capital", field: "index_name", index: "Ünicode"},
		{name: "the reserved index name x-read", field: "index_name", index: "x-read"},
		{name: "the reserved index name x-write", field: "index_name", index: "x-write"},
		{name: "the reserved index name x-000001", field: "index_name", index: "x-000001"},
		{name: "the reserved index name x-123456", field: "index_name", index: "x-123456"},
	}
	for _, c := range []string{`\`, `/`, `*`, `?`, `"`, `<`, `>`, `|`, `,`, `#`, ` `, `:`} {
		what := fmt.Sprintf("%q", c)
		if c == " " {
			what = "a space"
		}
		cases = append(cases, badEvent{name: "an index name containing " + what, field: "index_name", index: "a" + c + "b"})
	}
	for i := range cases {
		cases[i] = ok(cases[i])
	}
	return cases
}

func TestAppendSQL(t *testing.T) {
	t.Parallel()

	t.Run("a rolled-back transaction leaves no event", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT `+e.ident+`.append('items', 'gone', 1, 'upsert', '{"a":1}')`); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if n := e.count(t, `true`); n != 0 {
			t.Fatalf("%d events after rollback, want 0", n)
		}
	})

	t.Run("a committed event is there with all fields", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var id int64
		var txid uint64
		if err := tx.QueryRow(ctx, `SELECT `+e.ident+`.append('items', 'doc-1', 7, 'upsert', '{"title":"hi"}', 'item.updated', '{"trace_id":"abc"}'),
			pg_current_xact_id()::text::bigint`).Scan(&id, &txid); err != nil {
			t.Fatal(err)
		}
		var txStart time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&txStart); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}

		var (
			index, source, op, doc, evType, headers string
			version                                 int64
			occurred, created                       time.Time
			xid                                     uint64
			bucket, wantBucket                      int
		)
		err = e.pool.QueryRow(ctx, `SELECT index_name, source_id, version, op, document::text, event_type, headers::text,
				occurred_at, created_at, xid::text::bigint, bucket, hashtext(source_id) & 1023
			FROM `+e.ident+`.events WHERE id = $1`, id).
			Scan(&index, &source, &version, &op, &doc, &evType, &headers, &occurred, &created, &xid, &bucket, &wantBucket)
		if err != nil {
			t.Fatal(err)
		}
		if index != "items" || source != "doc-1" || version != 7 || op != "upsert" || doc != `{"title": "hi"}` ||
			evType != "item.updated" || headers != `{"trace_id": "abc"}` {
			t.Errorf("got %q %q v%d %q %s %q %s", index, source, version, op, doc, evType, headers)
		}
		if !occurred.Equal(txStart) || !created.Equal(txStart) {
			t.Errorf("occurred_at %v, created_at %v, want the transaction's start %v", occurred, created, txStart)
		}
		if xid != txid {
			t.Errorf("xid %d, want the writing transaction's %d", xid, txid)
		}
		if bucket != wantBucket || bucket < 0 || bucket > 1023 {
			t.Errorf("bucket %d, want %d", bucket, wantBucket)
		}
	})

	t.Run("a delete carries no document and an optional event type", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		var id int64
		if err := e.pool.QueryRow(ctx, `SELECT `+e.ident+`.append('items', 'doc-1', 2, 'delete', NULL)`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		var hasDoc, hasType bool
		if err := e.pool.QueryRow(ctx, `SELECT document IS NOT NULL, event_type IS NOT NULL FROM `+e.ident+`.events WHERE id = $1 AND op = 'delete'`, id).Scan(&hasDoc, &hasType); err != nil {
			t.Fatal(err)
		}
		if hasDoc || hasType {
			t.Fatalf("document present %v, event_type present %v; want neither", hasDoc, hasType)
		}
	})

	t.Run("each bad input is refused naming the field, and the caller's transaction fails", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		for _, c := range badEvents() {
			t.Run(c.name, func(t *testing.T) {
				ctx := t.Context()
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				// A business write before the append: it must not survive.
				if _, err := tx.Exec(ctx, `INSERT INTO `+e.ident+`.audit_log (operator, action) VALUES ('test', 'business row')`); err != nil {
					t.Fatal(err)
				}
				_, err = tx.Exec(ctx, `SELECT `+e.ident+`.append($1, $2, $3, $4, $5::jsonb, NULL, $6::jsonb)`,
					c.index, c.source, c.version, c.op, c.doc, c.header)
				if err == nil {
					t.Fatal("append accepted the event")
				}
				if !mentionsField(err.Error(), c.field) {
					t.Errorf("error %q does not name %s", err, c.field)
				}
				if _, err := tx.Exec(ctx, `SELECT 1`); sqlState(err) != "25P02" {
					t.Errorf("transaction still usable after a refused append: %v", err)
				}
				if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
					t.Errorf("commit after a refused append: %v, want ErrTxCommitRollback", err)
				}
				if n := e.count(t, `true`); n != 0 {
					t.Errorf("%d events written", n)
				}
				var rows int
				if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.ident+`.audit_log`).Scan(&rows); err != nil || rows != 0 {
					t.Errorf("business row survived: %d rows, %v", rows, err)
				}
			})
		}
	})

	t.Run("each bad input is refused by a direct INSERT naming the field", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		for _, c := range badEvents() {
			t.Run(c.name, func(t *testing.T) {
				_, err := e.pool.Exec(t.Context(), `INSERT INTO `+e.ident+`.events (index_name, source_id, version, op, document, headers)
					VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb)`, c.index, c.source, c.version, c.op, c.doc, c.header)
				if err == nil {
					t.Fatal("INSERT accepted the event")
				}
				if !mentionsField(err.Error(), c.field) {
					t.Errorf("error %q does not name %s", err, c.field)
				}
				if n := e.count(t, `true`); n != 0 {
					t.Errorf("%d events written", n)
				}
			})
		}
	})

	t.Run("the longest valid source_id and index name are accepted", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		source := strings.Repeat("s", 512)
		// 248 bytes: outboxd's concrete index N-000001 must fit Elasticsearch's 255.
		for _, index := range []string{strings.Repeat("i", 248), "a-b_c.d+e", "x.", "ünïcode", "x-reader", "x-00001", "x-0000001", "read", "x-read.v2"} {
			if _, err := e.pool.Exec(ctx, `SELECT `+e.ident+`.append($1, $2, 1, 'upsert', '{}')`, index, source); err != nil {
				t.Errorf("append %q: %v", index, err)
			}
			if _, err := e.pool.Exec(ctx, `INSERT INTO `+e.ident+`.events (index_name, source_id, version, op) VALUES ($1, $2, 1, 'delete')`, index, source); err != nil {
				t.Errorf("INSERT %q: %v", index, err)
			}
		}
		if n := e.count(t, `source_id = $1`, source); n != 18 {
			t.Fatalf("%d events, want 18", n)
		}
	})
}

func TestAutoVersion(t *testing.T) {
	t.Parallel()

	t.Run("concurrent writers of one source get versions strictly increasing in commit order", func(t *testing.T) {
		t.Parallel()
		checkCommitOrder(t, setup(t))
	})

	t.Run("writers of different sources do not block each other", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		holder, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(ctx)
		if _, err := holder.Exec(ctx, `SELECT `+e.ident+`.append('items', 'x', NULL, 'upsert', '{}')`); err != nil {
			t.Fatal(err)
		}

		appendWithin := func(index, source, timeout string) error {
			return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+timeout+`'`); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `SELECT `+e.ident+`.append($1, $2, NULL, 'upsert', '{}')`, index, source)
				return err
			})
		}
		// lock_timeout turns "blocked" into an error instead of a hang; it
		// is a bound, not a performance assertion.
		if err := appendWithin("items", "y", "10s"); err != nil {
			t.Errorf("another source of the same index: %v", err)
		}
		if err := appendWithin("other", "x", "10s"); err != nil {
			t.Errorf("the same source id in another index: %v", err)
		}
		// The control: the same source really is held by the open writer.
		if err := appendWithin("items", "x", "200ms"); sqlState(err) != "55P03" {
			t.Errorf("the same source while another writer holds it: %v, want lock_not_available", err)
		}
	})

	t.Run("a rolled-back append does not use up a version", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		appendOne := func() int64 {
			var id, v int64
			if err := e.pool.QueryRow(ctx, `SELECT `+e.ident+`.append('items', 'r', NULL, 'delete', NULL)`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if err := e.pool.QueryRow(ctx, `SELECT version FROM `+e.ident+`.events WHERE id = $1`, id).Scan(&v); err != nil {
				t.Fatal(err)
			}
			return v
		}
		if v := appendOne(); v != 1 {
			t.Fatalf("first version %d, want 1", v)
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT `+e.ident+`.append('items', 'r', NULL, 'upsert', '{}')`); err != nil {
			t.Fatal(err)
		}
		tx.Rollback(ctx)
		if v := appendOne(); v != 2 {
			t.Fatalf("version after a rollback %d, want 2", v)
		}
	})
}

func TestCapture(t *testing.T) {
	t.Parallel()

	type event struct {
		Op, Source, Doc, Type string
		Version               int64
	}
	events := func(t *testing.T, e *env, index string) []event {
		t.Helper()
		rows, err := e.pool.Query(t.Context(), `SELECT op, source_id, coalesce(document::text, ''), coalesce(event_type, ''), version
			FROM `+e.ident+`.events WHERE index_name = $1 ORDER BY id`, index)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[event])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	exec := func(t *testing.T, db interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, sql string, args ...any) {
		t.Helper()
		if _, err := db.Exec(t.Context(), sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	t.Run("a table with a version column yields its row versions", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		tbl := e.ident + `."Tutorial Items"`
		exec(t, e.pool, `CREATE TABLE `+tbl+` (id bigint PRIMARY KEY, title text, version bigint NOT NULL DEFAULT 1)`)
		exec(t, e.pool, `SELECT `+e.ident+`.capture($1, 'items', 'id', 'version')`, tbl)

		exec(t, e.pool, `INSERT INTO `+tbl+` (id, title) VALUES (1, 'first')`)
		exec(t, e.pool, `UPDATE `+tbl+` SET title = 'second', version = version + 1 WHERE id = 1`)
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		exec(t, tx, `UPDATE `+tbl+` SET title = 'never', version = version + 1 WHERE id = 1`)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		exec(t, e.pool, `DELETE FROM `+tbl+` WHERE id = 1`)

		want := []event{
			{"upsert", "1", `{"id": 1, "title": "first", "version": 1}`, "Tutorial Items.inserted", 1},
			{"upsert", "1", `{"id": 1, "title": "second", "version": 2}`, "Tutorial Items.updated", 2},
			// A delete is one past the last row version, so it beats every
			// update that row ever had.
			{"delete", "1", "", "Tutorial Items.deleted", 3},
		}
		if got := events(t, e, "items"); !slices.Equal(got, want) {
			t.Fatalf("events\n got %+v\nwant %+v", got, want)
		}
	})

	t.Run("a table without a version column is auto-versioned", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := t.Context()
		tbl := e.ident + `.notes`
		exec(t, e.pool, `CREATE TABLE `+tbl+` (code text PRIMARY KEY, body text)`)
		exec(t, e.pool, `SELECT `+e.ident+`.capture($1, 'notes', 'code')`, tbl)

		exec(t, e.pool, `INSERT INTO `+tbl+` VALUES ('a', 'one'), ('b', 'uno')`)
		exec(t, e.pool, `UPDATE `+tbl+` SET body = 'two' WHERE code = 'a'`)
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		exec(t, tx, `UPDATE `+tbl+` SET body = 'never'`)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		exec(t, e.pool, `DELETE FROM `+tbl+` WHERE code = 'a'`)

		want := []event{
			{"upsert", "a", `{"body": "one", "code": "a"}`, "notes.inserted", 1},
			{"upsert", "b", `{"body": "uno", "code": "b"}`, "notes.inserted", 1},
			{"upsert", "a", `{"body": "two", "code": "a"}`, "notes.updated", 2},
			{"delete", "a", "", "notes.deleted", 3},
		}
		if got := events(t, e, "notes"); !slices.Equal(got, want) {
			t.Fatalf("events\n got %+v\nwant %+v", got, want)
		}
	})

	t.Run("an update that changes the id deletes the old id above its version and upserts the new one", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		tbl := e.ident + `.moves`
		exec(t, e.pool, `CREATE TABLE `+tbl+` (id bigint PRIMARY KEY, title text, version bigint NOT NULL DEFAULT 1)`)
		exec(t, e.pool, `SELECT `+e.ident+`.capture($1, 'moves', 'id', 'version')`, tbl)

		exec(t, e.pool, `INSERT INTO `+tbl+` (id, title) VALUES (1, 'a')`)
		exec(t, e.pool, `UPDATE `+tbl+` SET title = 'b', version = 4 WHERE id = 1`)
		exec(t, e.pool, `UPDATE `+tbl+` SET id = 2, version = version + 1 WHERE id = 1`)
		exec(t, e.pool, `UPDATE `+tbl+` SET title = 'c', version = version + 1 WHERE id = 2`)
		// The chosen rule for a re-used id: its version column restarts at
		// 1, below the old id's tombstone (5), so Elasticsearch keeps it
		// hidden until its version passes 5.
		exec(t, e.pool, `INSERT INTO `+tbl+` (id, title) VALUES (1, 'again')`)

		want := []event{
			{"upsert", "1", `{"id": 1, "title": "a", "version": 1}`, "moves.inserted", 1},
			{"upsert", "1", `{"id": 1, "title": "b", "version": 4}`, "moves.updated", 4},
			{"delete", "1", "", "moves.deleted", 5},
			{"upsert", "2", `{"id": 2, "title": "b", "version": 5}`, "moves.updated", 5},
			{"upsert", "2", `{"id": 2, "title": "c", "version": 6}`, "moves.updated", 6},
			{"upsert", "1", `{"id": 1, "title": "again", "version": 1}`, "moves.inserted", 1},
		}
		if got := events(t, e, "moves"); !slices.Equal(got, want) {
			t.Fatalf("events\n got %+v\nwant %+v", got, want)
		}
	})

	t.Run("without a version column a moved or re-used id continues the outbox counter", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		tbl := e.ident + `.codes`
		exec(t, e.pool, `CREATE TABLE `+tbl+` (code text PRIMARY KEY)`)
		exec(t, e.pool, `SELECT `+e.ident+`.capture($1, 'codes', 'code')`, tbl)

		exec(t, e.pool, `INSERT INTO `+tbl+` VALUES ('a')`)
		exec(t, e.pool, `UPDATE `+tbl+` SET code = 'b' WHERE code = 'a'`)
		exec(t, e.pool, `INSERT INTO `+tbl+` VALUES ('a')`)

		want := []event{
			{"upsert", "a", `{"code": "a"}`, "codes.inserted", 1},
			{"delete", "a", "", "codes.deleted", 2},
			{"upsert", "b", `{"code": "b"}`, "codes.updated", 1},
			// Above the tombstone at 2: the re-inserted row is visible.
			{"upsert", "a", `{"code": "a"}`, "codes.inserted", 3},
		}
		if got := events(t, e, "codes"); !slices.Equal(got, want) {
			t.Fatalf("events\n got %+v\nwant %+v", got, want)
		}
	})

	t.Run("uncapture stops the events and capture twice installs one trigger", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		tbl := e.ident + `.things`
		exec(t, e.pool, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
		exec(t, e.pool, `SELECT `+e.ident+`.capture($1, 'things', 'id')`, tbl)
		exec(t, e.pool, `SELECT `+e.ident+`.capture($1, 'things', 'id')`, tbl)
		exec(t, e.pool, `INSERT INTO `+tbl+` VALUES (1)`)
		if n := e.count(t, `true`); n != 1 {
			t.Fatalf("%d events after one insert, want 1", n)
		}
		exec(t, e.pool, `SELECT `+e.ident+`.uncapture($1)`, tbl)
		exec(t, e.pool, `INSERT INTO `+tbl+` VALUES (2)`)
		exec(t, e.pool, `DELETE FROM `+tbl)
		if n := e.count(t, `true`); n != 1 {
			t.Fatalf("%d events after uncapture, want still 1", n)
		}
		exec(t, e.pool, `SELECT `+e.ident+`.uncapture($1)`, tbl) // no trigger left: still fine
	})

	t.Run("bad capture arguments are refused naming them", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		tbl := e.ident + `.things`
		exec(t, e.pool, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, version bigint)`)
		for _, c := range []struct {
			field              string
			index, id, version any
		}{
			{"id_column", "things", "nope", nil},
			{"id_column", "things", nil, nil},
			{"version_column", "things", "id", "nope"},
			{"index_name", "Things", "id", nil},
			{"index_name", "", "id", nil},
			{"index_name", ".", "id", nil},
			{"index_name", "a b", "id", nil},
			{"index_name", nil, "id", nil},
		} {
			_, err := e.pool.Exec(t.Context(), `SELECT `+e.ident+`.capture($1, $2, $3, $4)`, tbl, c.index, c.id, c.version)
			if err == nil || !mentionsField(err.Error(), c.field) {
				t.Errorf("capture(%v, %v, %v): %v, want an error naming %s", c.index, c.id, c.version, err, c.field)
			}
		}
		var triggers int
		if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass`, tbl).Scan(&triggers); err != nil || triggers != 0 {
			t.Fatalf("%d triggers installed by refused captures, %v", triggers, err)
		}
	})

	t.Run("a row the outbox refuses fails the business statement", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		tbl := e.ident + `.loose`
		exec(t, e.pool, `CREATE TABLE `+tbl+` (id text, body text)`)
		exec(t, e.pool, `SELECT `+e.ident+`.capture($1, 'loose', 'id')`, tbl)
		_, err := e.pool.Exec(t.Context(), `INSERT INTO `+tbl+` VALUES (NULL, 'no id')`)
		if err == nil || !mentionsField(err.Error(), "source_id") {
			t.Fatalf("insert of a row without an id: %v, want a source_id error", err)
		}
		var rows int
		if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+tbl).Scan(&rows); err != nil || rows != 0 {
			t.Fatalf("%d rows written, %v", rows, err)
		}
	})
}

// checkCommitOrder runs 8 writers appending auto-versioned events to one
// source and fails unless versions are exactly 1..N and each was assigned
// only after the previous one committed.
func checkCommitOrder(t *testing.T, e *env) {
	t.Helper()
	const writers, rounds = 8, 25
	type result struct {
		version       int64
		prevCommitted bool
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
		errs    = make(chan error, writers)
	)
	for w := range writers {
		wg.Go(func() {
			ctx := t.Context()
			for r := range rounds {
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					var id int64
					if err := tx.QueryRow(ctx, `SELECT `+e.ident+`.append('items', 'one', NULL, 'upsert', $1::jsonb)`,
						fmt.Sprintf(`{"writer":%d,"round":%d}`, w, r)).Scan(&id); err != nil {
						return err
					}
					// A new statement's snapshot shows what has committed.
					// Version v-1 must already be committed when this
					// transaction holds v: that is what makes version order
					// commit order. A sequence or max()+1 without the
					// counter row lock fails here or with duplicates.
					var res result
					if err := tx.QueryRow(ctx, `SELECT e.version, e.version = 1 OR EXISTS (
							SELECT 1 FROM `+e.ident+`.events p
							WHERE p.index_name = e.index_name AND p.source_id = e.source_id AND p.version = e.version - 1)
						FROM `+e.ident+`.events e WHERE e.id = $1`, id).Scan(&res.version, &res.prevCommitted); err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
					mu.Lock()
					results = append(results, res)
					mu.Unlock()
					return nil
				})
				if err != nil {
					errs <- fmt.Errorf("writer %d round %d: %w", w, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	slices.SortFunc(results, func(a, b result) int { return int(a.version - b.version) })
	for i, r := range results {
		if r.version != int64(i+1) {
			t.Fatalf("versions are not exactly 1..%d: position %d holds %d", writers*rounds, i, r.version)
		}
		if !r.prevCommitted {
			t.Errorf("version %d was assigned before version %d committed", r.version, r.version-1)
		}
	}
	var distinct, maxV, counter int64
	if err := e.pool.QueryRow(t.Context(), `SELECT count(DISTINCT version), max(version),
			(SELECT version FROM `+e.ident+`.versions WHERE index_name = 'items' AND source_id = 'one')
		FROM `+e.ident+`.events`).Scan(&distinct, &maxV, &counter); err != nil {
		t.Fatal(err)
	}
	if distinct != writers*rounds || maxV != writers*rounds || counter != writers*rounds {
		t.Fatalf("distinct %d, max %d, counter %d; want %d each", distinct, maxV, counter, writers*rounds)
	}
}
