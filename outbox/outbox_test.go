package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/schema/schematest"
)

// The three things callers hold all satisfy outbox.DB.
var (
	_ outbox.DB = pgx.Tx(nil)
	_ outbox.DB = (*pgx.Conn)(nil)
	_ outbox.DB = (*pgxpool.Pool)(nil)
)

type outboxEnv struct {
	pool   *pgxpool.Pool
	outbox *outbox.Outbox
}

func setupOutbox(t testing.TB) *outboxEnv {
	t.Helper()
	pool, name := schematest.Setup(t)
	ob, err := outbox.NewOutbox(name)
	if err != nil {
		t.Fatal(err)
	}
	return &outboxEnv{pool: pool, outbox: ob}
}

func (e *outboxEnv) count(t testing.TB) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.outbox.Schema()+`.events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// stored reads an event back with every column the caller can set.
func (e *outboxEnv) stored(t testing.TB, id int64) outbox.Event {
	t.Helper()
	var ev outbox.Event
	var doc, headers, evType *string
	err := e.pool.QueryRow(context.Background(), `SELECT id, xid::text::bigint, index_name, source_id, version, op,
			document::text, event_type, headers::text, occurred_at, created_at
		FROM `+e.outbox.Schema()+`.events WHERE id = $1`, id).
		Scan(&ev.ID, &ev.XID, &ev.IndexName, &ev.SourceID, &ev.Version, &ev.Op, &doc, &evType, &headers, &ev.OccurredAt, &ev.CreatedAt)
	if err != nil {
		t.Fatalf("event %d: %v", id, err)
	}
	if doc != nil {
		ev.Document = json.RawMessage(*doc)
	}
	if headers != nil {
		ev.Headers = json.RawMessage(*headers)
	}
	if evType != nil {
		ev.EventType = *evType
	}
	return ev
}

func upsert(source string, version int64) outbox.Event {
	return outbox.Event{IndexName: "tutorials", SourceID: source, Version: version, Op: outbox.OpUpsert,
		Document: json.RawMessage(fmt.Sprintf(`{"title": "t-%s", "version": %d}`, source, version))}
}

func TestOutboxAppend(t *testing.T) {
	t.Parallel()

	t.Run("a rolled-back transaction leaves no event", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ctx := t.Context()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.outbox.Append(ctx, tx, upsert("a", 1)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.outbox.Append(ctx, tx, upsert("a", 0)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if n := e.count(t); n != 0 {
			t.Fatalf("%d events after rollback", n)
		}
	})

	t.Run("a committed event is there with all fields", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ctx := t.Context()
		occurred := time.Date(2024, 5, 6, 7, 8, 9, 123000, time.UTC)
		want := outbox.Event{
			IndexName: "tutorials", SourceID: "tut-42", Version: 3, Op: outbox.OpUpsert,
			Document:   json.RawMessage(`{"title": "Outbox"}`),
			EventType:  "tutorial.updated",
			Headers:    json.RawMessage(`{"trace_id": "t-1"}`),
			OccurredAt: occurred,
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id, err := e.outbox.Append(ctx, tx, want)
		if err != nil {
			t.Fatal(err)
		}
		var txid uint64
		var txStart time.Time
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint, now()`).Scan(&txid, &txStart); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		got := e.stored(t, id)
		if got.IndexName != want.IndexName || got.SourceID != want.SourceID || got.Version != want.Version || got.Op != want.Op ||
			string(got.Document) != string(want.Document) || got.EventType != want.EventType || string(got.Headers) != string(want.Headers) {
			t.Errorf("stored %+v\nwant  %+v", got, want)
		}
		if !got.OccurredAt.Equal(occurred) {
			t.Errorf("occurred_at %v, want the caller's %v", got.OccurredAt, occurred)
		}
		if !got.CreatedAt.Equal(txStart) {
			t.Errorf("created_at %v, want the transaction's start %v", got.CreatedAt, txStart)
		}
		if got.XID != txid {
			t.Errorf("xid %d, want the writing transaction's %d", got.XID, txid)
		}
	})

	t.Run("version 0 asks for the next version of the source", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ctx := t.Context()
		for want := int64(1); want <= 3; want++ {
			id, err := e.outbox.Append(ctx, e.pool, upsert("auto", 0))
			if err != nil {
				t.Fatal(err)
			}
			if got := e.stored(t, id); got.Version != want {
				t.Fatalf("version %d, want %d", got.Version, want)
			}
		}
		id, err := e.outbox.Append(ctx, e.pool, outbox.Event{IndexName: "tutorials", SourceID: "auto", Op: outbox.OpDelete})
		if err != nil {
			t.Fatal(err)
		}
		if got := e.stored(t, id); got.Version != 4 || got.Op != outbox.OpDelete || got.Document != nil {
			t.Fatalf("delete stored as %+v, want version 4 without a document", got)
		}
	})

	t.Run("a transaction, a connection and a pool all work", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ctx := t.Context()
		conn, err := e.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i, db := range []outbox.DB{tx, conn.Conn(), e.pool} {
			if _, err := e.outbox.Append(ctx, db, upsert(fmt.Sprint(i), 1)); err != nil {
				t.Fatalf("db %d (%T): %v", i, db, err)
			}
			if _, err := e.outbox.AppendBatch(ctx, db, []outbox.Event{upsert(fmt.Sprint(i), 2), upsert(fmt.Sprint(i), 0)}); err != nil {
				t.Fatalf("batch on db %d (%T): %v", i, db, err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if n := e.count(t); n != 9 {
			t.Fatalf("%d events, want 9", n)
		}
	})

	t.Run("a schema name with a capital letter and a space works", func(t *testing.T) {
		t.Parallel()
		pool := schematest.Pool(t)
		name := "Out Box " + schematest.Name("")
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
		})
		if _, err := schema.Migrate(t.Context(), pool, name); err != nil {
			t.Fatal(err)
		}
		ob, err := outbox.NewOutbox(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Append(t.Context(), pool, upsert("a", 0)); err != nil {
			t.Fatal(err)
		}
		if _, err := ob.AppendBatch(t.Context(), pool, []outbox.Event{upsert("b", 1), upsert("c", 0)}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a schema name with a single quote is refused", func(t *testing.T) {
		t.Parallel()
		if _, err := outbox.NewOutbox("it's"); err == nil || !strings.Contains(err.Error(), "single quote") {
			t.Fatalf("NewOutbox: %v, want a single quote error", err)
		}
	})
}

func badGoEvents() []struct {
	name  string
	field string
	event outbox.Event
} {
	ok := upsert("s1", 1)
	with := func(f func(e *outbox.Event)) outbox.Event {
		e := ok
		f(&e)
		return e
	}
	cases := []struct {
		name  string
		field string
		event outbox.Event
	}{
		{"an empty source_id", "source_id", with(func(e *outbox.Event) { e.SourceID = "" })},
		{"a source_id of 513 bytes", "source_id", with(func(e *outbox.Event) { e.SourceID = strings.Repeat("x", 513) })},
		{"a negative version", "version", with(func(e *outbox.Event) { e.Version = -1 })},
		{"op merge", "op", with(func(e *outbox.Event) { e.Op = "merge" })},
		{"an empty op", "op", with(func(e *outbox.Event) { e.Op = "" })},
		{"an upsert without a document", "document", with(func(e *outbox.Event) { e.Document = nil })},
		{"an upsert with a JSON array", "document", with(func(e *outbox.Event) { e.Document = json.RawMessage(`[1]`) })},
		{"an upsert with a JSON string", "document", with(func(e *outbox.Event) { e.Document = json.RawMessage(`"x"`) })},
		{"an upsert with broken JSON", "document", with(func(e *outbox.Event) { e.Document = json.RawMessage(`{"a":`) })},
		{"a delete with a document", "document", with(func(e *outbox.Event) { e.Op = outbox.OpDelete })},
		{"a document with the reserved field outboxd_deleted", "document", with(func(e *outbox.Event) { e.Document = json.RawMessage(`{"a": 1, "outboxd_deleted": true}`) })},
		{"a document with the reserved field outboxd_deleted_at", "document", with(func(e *outbox.Event) { e.Document = json.RawMessage(`{"outboxd_deleted_at": "2026-01-01T00:00:00Z"}`) })},
		{"a document with a reserved field spelled with escapes", "document", with(func(e *outbox.Event) { e.Document = json.RawMessage(`{"outboxd\u005fdeleted": true}`) })},
		{"headers that are not an object", "headers", with(func(e *outbox.Event) { e.Headers = json.RawMessage(`[]`) })},
		{"an empty index name", "index_name", with(func(e *outbox.Event) { e.IndexName = "" })},
		{"an uppercase index name", "index_name", with(func(e *outbox.Event) { e.IndexName = "Tutorials" })},
		{"an index name of 256 bytes", "index_name", with(func(e *outbox.Event) { e.IndexName = strings.Repeat("i", 256) })},
		{"the index name .", "index_name", with(func(e *outbox.Event) { e.IndexName = "." })},
		{"the index name ..", "index_name", with(func(e *outbox.Event) { e.IndexName = ".." })},
		{"an index name of 249 bytes", "index_name", with(func(e *outbox.Event) { e.IndexName = strings.Repeat("i", 249) })},
		{"an index name with a non-ASCII capital", "index_name", with(func(e *outbox.Event) { e.IndexName = "Ünicode" })},
	}
	for _, n := range []string{"x-read", "x-write", "x-000001", "x-123456"} {
		cases = append(cases, struct {
			name  string
			field string
			event outbox.Event
		}{"the reserved index name " + n, "index_name", with(func(e *outbox.Event) { e.IndexName = n })})
	}
	for _, p := range []string{"_", "-", "+", "."} {
		cases = append(cases, struct {
			name  string
			field string
			event outbox.Event
		}{"an index name starting with " + p, "index_name", with(func(e *outbox.Event) { e.IndexName = p + "x" })})
	}
	for _, c := range []string{`\`, `/`, `*`, `?`, `"`, `<`, `>`, `|`, `,`, `#`, ` `, `:`} {
		what := fmt.Sprintf("%q", c)
		if c == " " {
			what = "a space"
		}
		cases = append(cases, struct {
			name  string
			field string
			event outbox.Event
		}{"an index name containing " + what, "index_name", with(func(e *outbox.Event) { e.IndexName = "a" + c + "b" })})
	}
	return cases
}

func TestOutboxValidation(t *testing.T) {
	t.Parallel()

	t.Run("each bad event returns a ValidationError naming the field and fails the transaction", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		for _, c := range badGoEvents() {
			t.Run(c.name, func(t *testing.T) {
				ctx := t.Context()
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				// The business row written before the append must not survive.
				if _, err := tx.Exec(ctx, `INSERT INTO `+e.outbox.Schema()+`.audit_log (operator, action) VALUES ('test', 'business row')`); err != nil {
					t.Fatal(err)
				}
				_, err = e.outbox.Append(ctx, tx, c.event)
				var ve *outbox.ValidationError
				if !errors.As(err, &ve) {
					t.Fatalf("Append: %v, want a *outbox.ValidationError", err)
				}
				if ve.Field != c.field || !strings.Contains(err.Error(), c.field+":") || ve.Reason == "" {
					t.Errorf("error %q (field %q), want it to name %s and a reason", err, ve.Field, c.field)
				}
				if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
					t.Error("the transaction is still usable after a refused append")
				}
				if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
					t.Errorf("commit after a refused append: %v, want ErrTxCommitRollback", err)
				}
				if n := e.count(t); n != 0 {
					t.Errorf("%d events written", n)
				}
				var rows int
				if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.outbox.Schema()+`.audit_log`).Scan(&rows); err != nil || rows != 0 {
					t.Errorf("business row survived: %d rows, %v", rows, err)
				}
			})
		}
	})

	t.Run("Validate checks without touching the database", func(t *testing.T) {
		t.Parallel()
		for _, c := range badGoEvents() {
			err := outbox.Validate(&c.event)
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) || ve.Field != c.field {
				t.Errorf("%s: %v, want a ValidationError for %s", c.name, err, c.field)
			}
		}
		for _, ev := range []outbox.Event{
			{IndexName: strings.Repeat("i", outbox.MaxIndexNameBytes), SourceID: strings.Repeat("s", 512), Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(` {"a": 1}`)},
			{IndexName: "a-b_c.d+e", SourceID: "x", Op: outbox.OpDelete},
			{IndexName: "x", SourceID: "x", Op: outbox.OpDelete, Document: json.RawMessage(`null`), Headers: json.RawMessage(`{"k":"v"}`)},
		} {
			if err := outbox.Validate(&ev); err != nil {
				t.Errorf("valid event refused: %v", err)
			}
		}
	})

	t.Run("the longest valid source_id and index name are written", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ev := upsert(strings.Repeat("s", 512), 1)
		ev.IndexName = strings.Repeat("i", outbox.MaxIndexNameBytes)
		if _, err := e.outbox.Append(t.Context(), e.pool, ev); err != nil {
			t.Fatal(err)
		}
		ev.Version = 0
		if _, err := e.outbox.Append(t.Context(), e.pool, ev); err != nil {
			t.Fatal(err)
		}
	})
}

func TestOutboxAppendBatch(t *testing.T) {
	t.Parallel()

	// 600 explicit versions go through COPY, 400 auto ones through a batch.
	mixed := func() []outbox.Event {
		var evs []outbox.Event
		for i := range 1000 {
			if i%5 < 3 {
				evs = append(evs, upsert(fmt.Sprintf("explicit-%d", i), int64(i+1)))
			} else {
				evs = append(evs, upsert(fmt.Sprintf("auto-%d", i%10), 0))
			}
		}
		evs = append(evs, outbox.Event{IndexName: "tutorials", SourceID: "explicit-0", Version: 2, Op: outbox.OpDelete})
		return evs
	}

	t.Run("a rolled-back batch leaves nothing", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ctx := t.Context()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n, err := e.outbox.AppendBatch(ctx, tx, mixed())
		if err != nil || n != 1001 {
			t.Fatalf("AppendBatch: %d, %v", n, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if n := e.count(t); n != 0 {
			t.Fatalf("%d events after rollback", n)
		}
	})

	t.Run("a committed batch is all there with the right versions", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ctx := t.Context()
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			n, err := e.outbox.AppendBatch(ctx, tx, mixed())
			if err == nil && n != 1001 {
				err = fmt.Errorf("wrote %d events, want 1001", n)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		var explicit, explicitOK, autoSources, autoMax, autoCount, deletes int
		if err := e.pool.QueryRow(ctx, `SELECT
				count(*) FILTER (WHERE source_id LIKE 'explicit-%' AND op = 'upsert'),
				count(*) FILTER (WHERE source_id LIKE 'explicit-%' AND op = 'upsert'
					AND version = split_part(source_id, '-', 2)::int + 1 AND document->>'title' = 't-' || source_id),
				count(DISTINCT source_id) FILTER (WHERE source_id LIKE 'auto-%'),
				coalesce(max(version) FILTER (WHERE source_id LIKE 'auto-%'), 0),
				count(*) FILTER (WHERE source_id LIKE 'auto-%'),
				count(*) FILTER (WHERE op = 'delete' AND document IS NULL AND version = 2)
			FROM `+e.outbox.Schema()+`.events`).Scan(&explicit, &explicitOK, &autoSources, &autoMax, &autoCount, &deletes); err != nil {
			t.Fatal(err)
		}
		// Each of the 4 auto sources (i%10 in 3,4,8,9) got 100 events: versions 1..100.
		if explicit != 600 || explicitOK != 600 || autoSources != 4 || autoCount != 400 || autoMax != 100 || deletes != 1 {
			t.Fatalf("explicit %d (ok %d), auto sources %d, auto events %d, max auto version %d, deletes %d",
				explicit, explicitOK, autoSources, autoCount, autoMax, deletes)
		}
	})

	t.Run("one bad event refuses the whole batch and fails the transaction", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ctx := t.Context()
		evs := mixed()
		evs[500].IndexName = "Bad"
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		_, err = e.outbox.AppendBatch(ctx, tx, evs)
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != "index_name" || !strings.Contains(err.Error(), "event 500") {
			t.Fatalf("AppendBatch: %v, want a ValidationError for event 500's index_name", err)
		}
		if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
			t.Errorf("commit after a refused batch: %v", err)
		}
		if n := e.count(t); n != 0 {
			t.Fatalf("%d events written", n)
		}
	})

	t.Run("a database refusal inside the batch fails the transaction", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ctx := t.Context()
		// A source_id with a NUL byte passes Validate, but PostgreSQL
		// cannot store it: the COPY fails on the server.
		evs := []outbox.Event{upsert("fine", 1), upsert("nul\x00byte", 2)}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := e.outbox.AppendBatch(ctx, tx, evs); err == nil {
			t.Fatal("AppendBatch accepted a source_id PostgreSQL cannot store")
		}
		var pgErr *pgconn.PgError
		if _, err := tx.Exec(ctx, `SELECT 1`); !errors.As(err, &pgErr) || pgErr.Code != "25P02" {
			t.Errorf("transaction after a failed COPY: %v, want aborted", err)
		}
		if n := e.count(t); n != 0 {
			t.Fatalf("%d events written", n)
		}
	})
}

func TestOutboxQueue(t *testing.T) {
	t.Parallel()

	business := func(t *testing.T, e *outboxEnv) string {
		t.Helper()
		table := e.outbox.Schema() + `.tutorials`
		if _, err := e.pool.Exec(t.Context(), `CREATE TABLE `+table+` (id text PRIMARY KEY, version bigint NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		return table
	}
	rows := func(t *testing.T, e *outboxEnv, table string) int {
		t.Helper()
		var n int
		if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("the event travels in the caller's batch and commits with the business row", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		table := business(t, e)
		var b pgx.Batch
		b.Queue(`INSERT INTO ` + table + ` VALUES ('a', 1)`)
		if err := e.outbox.Queue(&b, upsert("a", 1)); err != nil {
			t.Fatal(err)
		}
		if err := e.outbox.Queue(&b, upsert("a", 0)); err != nil {
			t.Fatal(err)
		}
		// No explicit transaction: pgx runs a batch as one implicit one.
		if err := e.pool.SendBatch(t.Context(), &b).Close(); err != nil {
			t.Fatal(err)
		}
		if n, ev := rows(t, e, table), e.count(t); n != 1 || ev != 2 {
			t.Fatalf("%d business rows and %d events, want 1 and 2", n, ev)
		}
	})

	t.Run("a refused event fails the whole batch", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		table := business(t, e)
		var b pgx.Batch
		b.Queue(`INSERT INTO ` + table + ` VALUES ('a', 1)`)
		bad := upsert("a", 1)
		bad.Document = nil
		err := e.outbox.Queue(&b, bad)
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != "document" {
			t.Fatalf("Queue: %v, want a ValidationError for document", err)
		}
		// A caller that ignores the error still cannot commit the row alone.
		if err := e.pool.SendBatch(t.Context(), &b).Close(); err == nil || !strings.Contains(err.Error(), "document:") {
			t.Fatalf("batch with a refused event: %v, want it to fail naming document", err)
		}
		if n, ev := rows(t, e, table), e.count(t); n != 0 || ev != 0 {
			t.Fatalf("%d business rows and %d events, want none", n, ev)
		}
	})
}

// The shape of a business write: the row and its event in one transaction.
// The UPDATE bumps the row's version, so the row lock orders concurrent
// writers and the event carries the version that commit order gives it.
func ExampleOutbox_Append() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	ob, err := outbox.NewOutbox("outbox")
	if err != nil {
		panic(err)
	}
	id, title := "42", "Transactional outbox"
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var version int64
		if err := tx.QueryRow(ctx, `UPDATE tutorials SET title = $2, version = version + 1 WHERE id = $1 RETURNING version`,
			id, title).Scan(&version); err != nil {
			return err
		}
		doc, err := json.Marshal(map[string]any{"id": id, "title": title})
		if err != nil {
			return err
		}
		_, err = ob.Append(ctx, tx, outbox.Event{
			IndexName: "tutorials",
			SourceID:  id,
			Version:   version,
			Op:        outbox.OpUpsert,
			Document:  doc,
			EventType: "tutorial.updated",
		})
		return err // a refused event fails the transaction: no row without its event
	})
	if err != nil {
		panic(err)
	}
}

// Queue puts the event in the same round trip as the business statement.
func ExampleOutbox_Queue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	ob, err := outbox.NewOutbox("outbox")
	if err != nil {
		panic(err)
	}
	var b pgx.Batch
	b.Queue(`INSERT INTO tutorials (id, title, version) VALUES ($1, $2, 1)`, "43", "Queued")
	if err := ob.Queue(&b, outbox.Event{
		IndexName: "tutorials", SourceID: "43", Version: 1, Op: outbox.OpUpsert,
		Document: json.RawMessage(`{"id": "43", "title": "Queued"}`),
	}); err != nil {
		panic(err)
	}
	// Sent alone, a pgx batch is one implicit transaction; inside
	// pgx.BeginFunc use tx.SendBatch instead.
	if err := pool.SendBatch(ctx, &b).Close(); err != nil {
		panic(err)
	}
}
