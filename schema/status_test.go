package schema_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/schema/schematest"
)

func TestInspect(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := schematest.Pool(t)
	name := newSchema(t, pool, schematest.Name("inspect_"))
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	inspect := func(t *testing.T) schema.Status {
		t.Helper()
		st, err := schema.Inspect(ctx, pool, name)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	t.Run("a schema never migrated does not exist and has every migration pending", func(t *testing.T) {
		if st := inspect(t); st.Exists || len(st.Pending) != len(ms) || st.UpToDate() {
			t.Fatalf("%+v", st)
		}
	})
	if _, err := schema.Migrate(ctx, pool, name); err != nil {
		t.Fatal(err)
	}
	t.Run("a migrated schema is up to date", func(t *testing.T) {
		if st := inspect(t); !st.UpToDate() || len(st.Applied) != len(ms) || len(st.Newer) != 0 {
			t.Fatalf("%+v", st)
		}
	})
	id := pgx.Identifier{name}.Sanitize()
	last := ms[len(ms)-1].Version
	if _, err := pool.Exec(ctx, `DELETE FROM `+id+`.schema_migrations WHERE version = $1`, last); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+id+`.schema_migrations (version, name) VALUES (9999, '9999_from_the_future')`); err != nil {
		t.Fatal(err)
	}
	t.Run("a missing version is pending, an unknown one newer", func(t *testing.T) {
		st := inspect(t)
		if st.UpToDate() || len(st.Pending) != 1 || st.Pending[0].Version != last || len(st.Newer) != 1 || st.Newer[0] != 9999 {
			t.Fatalf("%+v", st)
		}
	})
}
