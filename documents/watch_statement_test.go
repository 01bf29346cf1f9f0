package documents_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/schema/schematest"
)

// triggersOf returns "name level" of the outboxd triggers on tbl, sorted.
func (e *env) triggersOf(t testing.TB, tbl string) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT tgname || CASE WHEN tgtype & 1 = 1 THEN ' row' ELSE ' statement' END
		FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname LIKE 'outboxd_watch_%' ORDER BY 1`, e.sql(tbl))
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func statementTriggers(index string) []string {
	d := documents.TriggerName(index)
	return []string{d + " statement", d + "_delete statement", d + "_insert statement"}
}

func TestWatchStatement(t *testing.T) {
	t.Parallel()

	t.Run("a watch is one statement-level trigger per event, and a statement refreshes each id once", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.define(t, "tutorials")
		e.watchAll(t, "tutorials")
		for _, tbl := range []string{"{s}.tutorials", "{s}.tags", "{s}.authors"} {
			if got := e.triggersOf(t, tbl); !slices.Equal(got, statementTriggers("tutorials")) {
				t.Fatalf("%s: triggers %v, want %v", tbl, got, statementTriggers("tutorials"))
			}
		}
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'), (2, 'bob');
			INSERT INTO {s}.tutorials (id, title, author_id) VALUES (1, 'a', 1), (2, 'b', 1), (3, 'c', 2)`)
		_, last := e.refreshes(t, 0)
		e.exec(t, `INSERT INTO {s}.tags VALUES (10, 1, 'x'), (11, 1, 'y'), (12, 2, 'z')`)
		got, last := e.refreshes(t, last)
		if want := list("tutorials", 1, 2); !slices.Equal(got, want) {
			t.Fatalf("three tags of two tutorials refreshed %v, want %v", got, want)
		}
		e.exec(t, `UPDATE {s}.tags SET tutorial_id = 3 WHERE tutorial_id = 1`)
		if got, last = e.refreshes(t, last); !slices.Equal(got, list("tutorials", 1, 3)) {
			t.Fatalf("moving two tags from 1 to 3 refreshed %v", got)
		}
		e.exec(t, `UPDATE {s}.tags SET name = name WHERE id = 99`)
		if got, last = e.refreshes(t, last); len(got) != 0 {
			t.Fatalf("an UPDATE of no rows refreshed %v", got)
		}
		// An unchanged row of a query key is recorded once (its old row),
		// a changed one twice (old and new), as the row trigger did.
		e.exec(t, `UPDATE {s}.authors SET name = CASE id WHEN 1 THEN 'ann' ELSE 'bob2' END`)
		if got, _ = e.refreshes(t, last); !slices.Equal(got, []string{"tutorials/watch", "tutorials/watch", "tutorials/watch"}) {
			t.Fatalf("one unchanged and one renamed author: %v, want 3 rows for the relay", got)
		}
	})

	t.Run("an expression key reads $1 as the row, but not inside a quoted string", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.define(t, "tutorials")
		if _, err := documents.AddWatch(context.Background(), e.pool, e.schema, documents.WatchOptions{
			Index: "tutorials", Table: e.id + ".tags", Key: `($1).name || '-$1-' || $1.id`, Operator: "test",
		}); err != nil {
			t.Fatal(err)
		}
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'); INSERT INTO {s}.tutorials VALUES (1, 'a', 1); INSERT INTO {s}.tags VALUES (7, 1, 'x')`)
		if got, _ := e.refreshes(t, 0); !slices.Equal(got, []string{"tutorials/x-$1-7"}) {
			t.Fatalf("refreshed %v", got)
		}
	})

	t.Run("refresh's checks hold for a whole statement, with its texts", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.define(t, "tutorials")
		if _, err := documents.AddWatch(context.Background(), e.pool, e.schema, documents.WatchOptions{
			Index: "tutorials", Table: e.id + ".tags", Key: `$1.name`, Operator: "test",
		}); err != nil {
			t.Fatal(err)
		}
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'); INSERT INTO {s}.tutorials VALUES (1, 'a', 1)`)
		for _, c := range []struct{ names, want string }{
			{`('ok'), ('')`, "outboxd: source_id: must not be empty"},
			{`('ok'), (repeat('x', 513))`, "outboxd: source_id: 513 bytes, Elasticsearch allows at most 512"},
		} {
			_, err := e.pool.Exec(context.Background(), e.sql(`INSERT INTO {s}.tags SELECT row_number() OVER (), 1, n FROM (VALUES `+c.names+`) AS v(n)`))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("tags %s: %v, want %q", c.names, err, c.want)
			}
		}
	})
}

func TestWatchUpgrade(t *testing.T) {
	t.Parallel()
	pool := schematest.Pool(t)
	ctx := context.Background()
	name := schematest.Name("t_stw_")
	e := &env{pool: pool, schema: name, id: pgx.Identifier{name}.Sanitize()}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+e.id+` CASCADE`) })
	e.exec(t, `CREATE SCHEMA {s}; CREATE TABLE {s}.schema_migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Version >= 40 {
			break
		}
		sql, err := schema.Render(m.SQL, name)
		if err != nil {
			t.Fatal(err)
		}
		e.exec(t, sql)
		e.exec(t, `INSERT INTO {s}.schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
	}
	e.exec(t, `CREATE TABLE {s}.authors (id bigint PRIMARY KEY, name text NOT NULL);
		CREATE TABLE {s}.tutorials (id bigint PRIMARY KEY, title text NOT NULL, author_id bigint NOT NULL, bump bigint NOT NULL DEFAULT 0);
		CREATE TABLE {s}.tags (id bigint, tutorial_id bigint NOT NULL, name text NOT NULL) PARTITION BY RANGE (id);
		CREATE TABLE {s}.tags_1 PARTITION OF {s}.tags FOR VALUES FROM (0) TO (1000)`)
	e.define(t, "tutorials")
	// The watches as the release before statement-level triggers installed them.
	trig := documents.TriggerName("tutorials")
	for _, w := range []struct{ table, key, keySQL, mode string }{
		{"tutorials", "id", `SELECT $1."id"`, "row"},
		{"tags", "$1.tutorial_id", "SELECT ($1.tutorial_id)", "row"},
		{"authors", "SELECT t.id FROM {s}.tutorials t WHERE t.author_id = $1.id", "SELECT t.id FROM {s}.tutorials t WHERE t.author_id = $1.id", "query"},
	} {
		var ddl string
		if err := pool.QueryRow(ctx, `SELECT format('CREATE TRIGGER %I AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s.watch_trigger(%L, %L, %L)',
			$1::text, $2::regclass, $3::text, 'tutorials', $4::text, $5::text)`, trig, e.sql("{s}."+w.table), e.id, e.sql(w.keySQL), w.mode).Scan(&ddl); err != nil {
			t.Fatal(err)
		}
		e.exec(t, ddl)
		e.exec(t, `INSERT INTO {s}.document_watches (index_name, tbl, key, key_sql, trigger_name, watched_by) VALUES ('tutorials', $1::regclass, $2, $3, $4, 'test')`,
			e.sql("{s}."+w.table), e.sql(w.key), e.sql(w.keySQL), trig)
	}
	e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'); INSERT INTO {s}.tutorials VALUES (1, 'a', 1), (2, 'b', 1); INSERT INTO {s}.tags VALUES (1, 1, 'x'), (2, 1, 'y')`)
	_, last := e.refreshes(t, 0)
	if _, err := schema.Migrate(ctx, pool, name); err != nil {
		t.Fatal(err)
	}
	for _, tbl := range []string{"{s}.tutorials", "{s}.tags", "{s}.authors"} {
		if got := e.triggersOf(t, tbl); !slices.Equal(got, statementTriggers("tutorials")) {
			t.Errorf("%s after the upgrade: triggers %v, want %v", tbl, got, statementTriggers("tutorials"))
		}
	}
	if got := e.triggersOf(t, "{s}.tags_1"); len(got) != 0 {
		t.Errorf("the partition keeps the row trigger's clone: %v", got)
	}
	e.exec(t, `UPDATE {s}.tags SET tutorial_id = 2`)
	got, last := e.refreshes(t, last)
	if !slices.Equal(got, list("tutorials", 1, 2)) {
		t.Errorf("moving both tags of the partitioned table refreshed %v, want each tutorial once", got)
	}
	e.exec(t, `UPDATE {s}.tutorials SET title = title || '!'; UPDATE {s}.authors SET name = 'ann2'`)
	if got, _ = e.refreshes(t, last); !slices.Equal(got, append(list("tutorials", 1, 2), "tutorials/watch", "tutorials/watch")) {
		t.Errorf("upgraded column and query keys refreshed %v", got)
	}
}
