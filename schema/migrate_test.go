package schema_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/schema/schematest"
)

// newSchema reserves a schema name that does not exist yet and drops it
// when the test ends.
func newSchema(t *testing.T, pool *pgxpool.Pool, name string) string {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`); err != nil {
			t.Logf("drop schema %q: %v", name, err)
		}
	})
	return name
}

// shape describes a schema's objects, so two migrated schemas can be
// compared: tables and columns, constraints, indexes, functions and the
// recorded migrations.
func shape(t *testing.T, pool *pgxpool.Pool, name string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `
		SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid
		WHERE n.nspname = $1 AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(co.oid)
		FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace WHERE n.nspname = $1
		UNION ALL
		SELECT 'index ' || indexname || ' ' || replace(indexdef, quote_ident($1), '<schema>') FROM pg_indexes WHERE schemaname = $1
		UNION ALL
		SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1`, name)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i] = strings.ReplaceAll(got[i], pgx.Identifier{name}.Sanitize()+".", "")
		got[i] = strings.ReplaceAll(got[i], name+".", "")
	}
	var versions []string
	rows, err = pool.Query(t.Context(), `SELECT 'migration ' || version || ' ' || name FROM `+pgx.Identifier{name}.Sanitize()+`.schema_migrations`)
	if err != nil {
		t.Fatal(err)
	}
	versions, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, versions...)
	slices.Sort(got)
	return got
}

func allVersions(t *testing.T) []int {
	t.Helper()
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var vs []int
	for _, m := range ms {
		vs = append(vs, m.Version)
	}
	return vs
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("migrating twice applies nothing the second time", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		before := shape(t, e.pool, e.name)
		done, err := schema.Migrate(t.Context(), e.pool, e.name)
		if err != nil {
			t.Fatal(err)
		}
		if len(done) != 0 {
			t.Fatalf("second migration applied %v", done)
		}
		if after := shape(t, e.pool, e.name); !slices.Equal(before, after) {
			t.Fatalf("the schema changed:\nbefore %v\nafter  %v", before, after)
		}
	})

	t.Run("concurrent migrations of a new schema are safe and end in the same state", func(t *testing.T) {
		t.Parallel()
		pool := schematest.Pool(t)
		reference := newSchema(t, pool, schematest.Name("t_ref_"))
		if _, err := schema.Migrate(t.Context(), pool, reference); err != nil {
			t.Fatal(err)
		}
		name := newSchema(t, pool, schematest.Name("t_conc_"))

		const migrators = 8
		results := make([][]int, migrators)
		errs := make([]error, migrators)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range migrators {
			wg.Go(func() {
				<-start
				results[i], errs[i] = schema.Migrate(t.Context(), pool, name)
			})
		}
		close(start)
		wg.Wait()

		winners := 0
		for i := range migrators {
			if errs[i] != nil {
				t.Errorf("migrator %d: %v", i, errs[i])
				continue
			}
			switch {
			case slices.Equal(results[i], allVersions(t)):
				winners++
			case len(results[i]) != 0:
				t.Errorf("migrator %d applied a partial set %v", i, results[i])
			}
		}
		if winners != 1 {
			t.Errorf("%d migrators applied the migrations, want exactly 1", winners)
		}
		want, got := shape(t, pool, reference), shape(t, pool, name)
		if len(want) < 50 {
			t.Fatalf("the reference schema's shape has only %d entries: %v", len(want), want)
		}
		if !slices.Equal(want, got) {
			t.Fatalf("concurrently migrated schema differs from a sequential one:\nwant %v\n got %v", want, got)
		}
	})

	t.Run("a schema name with a capital letter, a space and a percent sign works end to end", func(t *testing.T) {
		t.Parallel()
		pool := schematest.Pool(t)
		name := newSchema(t, pool, "Out Box %s "+schematest.Name(""))
		ctx := t.Context()
		if _, err := schema.Migrate(ctx, pool, name); err != nil {
			t.Fatal(err)
		}
		if done, err := schema.Migrate(ctx, pool, name); err != nil || len(done) != 0 {
			t.Fatalf("second migration: %v, %v", done, err)
		}
		id := pgx.Identifier{name}.Sanitize()
		if _, err := pool.Exec(ctx, `SELECT `+id+`.append('items', 'a', NULL, 'upsert', '{"x":1}')`); err != nil {
			t.Fatalf("append: %v", err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE `+id+`."My Table" ("Id" int PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `SELECT `+id+`.capture($1, 'items', 'Id')`, id+`."My Table"`); err != nil {
			t.Fatalf("capture: %v", err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO `+id+`."My Table" VALUES (7)`); err != nil {
			t.Fatalf("captured insert: %v", err)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+id+`.events WHERE source_id IN ('a', '7')`).Scan(&n); err != nil || n != 2 {
			t.Fatalf("%d events, %v; want 2", n, err)
		}
	})

	t.Run("upgrading an outbox that holds events with now reserved index names succeeds and refuses new ones", func(t *testing.T) {
		t.Parallel()
		pool := schematest.Pool(t)
		name := newSchema(t, pool, schematest.Name("t_up_"))
		id := pgx.Identifier{name}.Sanitize()
		ctx := t.Context()
		// The schema as migrations 1-3 left it, with an event the later
		// rules refuse.
		if _, err := pool.Exec(ctx, `CREATE SCHEMA `+id+`; CREATE TABLE `+id+`.schema_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			t.Fatal(err)
		}
		ms, err := schema.Migrations()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms[:3] {
			sql, err := schema.Render(m.SQL, name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", m.Name, err)
			}
			if _, err := pool.Exec(ctx, `INSERT INTO `+id+`.schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, `SELECT `+id+`.append('items-read', 'old', 1, 'delete', NULL)`); err != nil {
			t.Fatalf("the old rules refused items-read: %v", err)
		}
		if _, err := schema.Migrate(ctx, pool, name); err != nil {
			t.Fatalf("upgrade over an event with a reserved name: %v", err)
		}
		_, err = pool.Exec(ctx, `INSERT INTO `+id+`.events (index_name, source_id, version, op) VALUES ('items-read', 'new', 1, 'delete')`)
		if err == nil || !strings.Contains(err.Error(), "index_name:") {
			t.Fatalf("a new event for items-read after the upgrade: %v, want an index_name refusal", err)
		}
	})

	t.Run("a bad schema name is refused with a clear error and nothing is created", func(t *testing.T) {
		t.Parallel()
		pool := schematest.Pool(t)
		for _, c := range []struct{ name, reason string }{
			{"it's" + schematest.Name(""), "single quote"},
			{"a$$b" + schematest.Name(""), "$"},
			{"a\x00b", "NUL"},
			{"", "empty"},
			{strings.Repeat("s", 64), "63"},
		} {
			_, err := schema.Migrate(t.Context(), pool, c.name)
			if err == nil || !strings.Contains(err.Error(), "name:") || !strings.Contains(err.Error(), c.reason) {
				t.Errorf("Migrate(%q): %v, want an error about the name saying %q", c.name, err, c.reason)
			}
			var exists bool
			if err := pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, strings.ReplaceAll(c.name, "\x00", "")).Scan(&exists); err != nil || exists {
				t.Errorf("schema %q exists after a refused migration (%v)", c.name, err)
			}
		}
	})
}
