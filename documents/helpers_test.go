package documents_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/schema/schematest"
)

// env is a migrated outbox schema holding the example's business tables
// too (tutorials, authors, tags), so one DROP SCHEMA cleans up both.
type env struct {
	pool   *pgxpool.Pool
	schema string
	id     string // quoted
}

func setup(t *testing.T) *env {
	t.Helper()
	pool, name := schematest.Setup(t)
	e := &env{pool: pool, schema: name, id: pgx.Identifier{name}.Sanitize()}
	e.exec(t, `CREATE TABLE {s}.authors (id bigint PRIMARY KEY, name text NOT NULL);
		CREATE TABLE {s}.tutorials (id bigint PRIMARY KEY, title text NOT NULL, author_id bigint NOT NULL REFERENCES {s}.authors, bump bigint NOT NULL DEFAULT 0);
		CREATE TABLE {s}.tags (id bigint PRIMARY KEY, tutorial_id bigint NOT NULL REFERENCES {s}.tutorials ON DELETE CASCADE, name text NOT NULL)`)
	return e
}

// sql replaces {s} with the quoted schema.
func (e *env) sql(q string) string { return strings.ReplaceAll(q, "{s}", e.id) }

func (e *env) exec(t testing.TB, q string, args ...any) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), e.sql(q), args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// definition is the README's tutorials document.
func (e *env) definition() string {
	return e.sql(`SELECT t.id::text, jsonb_build_object('title', t.title, 'author', a.name, 'bump', t.bump,
		'tags', (SELECT coalesce(jsonb_agg(g.name ORDER BY g.name), '[]') FROM {s}.tags g WHERE g.tutorial_id = t.id))
		FROM {s}.tutorials t JOIN {s}.authors a ON a.id = t.author_id WHERE t.id::text = ANY($1)`)
}

func (e *env) define(t testing.TB, index string) {
	t.Helper()
	if _, err := documents.Define(context.Background(), e.pool, e.schema, documents.DefineOptions{Index: index, SQL: e.definition(), Operator: "test"}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) watchAll(t testing.TB, index string) {
	t.Helper()
	for _, w := range []struct{ table, key string }{
		{"tutorials", "id"},
		{"tags", "$1.tutorial_id"},
		{"authors", "SELECT t.id FROM {s}.tutorials t WHERE t.author_id = $1.id"},
	} {
		if _, err := documents.AddWatch(context.Background(), e.pool, e.schema, documents.WatchOptions{
			Index: index, Table: e.id + "." + w.table, Key: e.sql(w.key), Operator: "test",
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// refreshes returns the "index/source_id" of the refresh events after id
// after ("index/watch" for a row the relay resolves), sorted, and the
// last event id.
func (e *env) refreshes(t testing.TB, after int64) ([]string, int64) {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), e.sql(`SELECT id, index_name || '/' || CASE WHEN event_type = 'refresh.watch' THEN 'watch' ELSE source_id END FROM {s}.events WHERE id > $1 AND op = 'refresh' ORDER BY id`), after)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	last := after
	for rows.Next() {
		var s string
		if err := rows.Scan(&last, &s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out, last
}

func list(prefix string, ids ...int) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = fmt.Sprintf("%s/%d", prefix, id)
	}
	slices.Sort(out)
	return out
}
