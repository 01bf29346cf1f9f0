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

func TestUpgrade(t *testing.T) {
	t.Parallel()

	t.Run("an outbox of the previous release is upgraded in place and keeps its events", func(t *testing.T) {
		t.Parallel()
		pool := schematest.Pool(t)
		ctx := context.Background()
		name := schematest.Name("t_up_")
		id := pgx.Identifier{name}.Sanitize()
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+id+` CASCADE`) })
		if _, err := pool.Exec(ctx, `CREATE SCHEMA `+id+`; CREATE TABLE `+id+`.schema_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			t.Fatal(err)
		}
		ms, err := schema.Migrations()
		if err != nil {
			t.Fatal(err)
		}
		var later []int // the migrations from definitions on
		for _, m := range ms {
			if m.Version >= 32 {
				later = append(later, m.Version)
				continue
			}
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
		if _, err := pool.Exec(ctx, `SELECT `+id+`.append('shop', '1', 1, 'upsert', '{"a":1}'); SELECT `+id+`.append('shop', '1', 2, 'delete', NULL)`); err != nil {
			t.Fatal(err)
		}
		done, err := schema.Migrate(ctx, pool, name)
		if err != nil || !slices.Equal(done, later) || later[0] != 32 {
			t.Fatalf("upgrade applied %v, %v; want %v, from 32 on", done, err, later)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+id+`.events WHERE index_name = 'shop'`).Scan(&n); err != nil || n != 2 {
			t.Fatalf("%d events kept, %v", n, err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE `+id+`.items (id int PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		if _, err := documents.Define(ctx, pool, name, documents.DefineOptions{Index: "items", Operator: "test", IDsSQL: `SELECT id FROM ` + id + `.items`,
			SQL: `SELECT i.id::text, jsonb_build_object('id', i.id) FROM ` + id + `.items i WHERE i.id::text = ANY($1)`}); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `SELECT `+id+`.refresh('items', '1')`); err != nil {
			t.Fatal(err)
		}
		_, err = documents.Define(ctx, pool, name, documents.DefineOptions{Index: "shop", Operator: "test", SQL: `SELECT i.id::text, '{}'::jsonb FROM ` + id + `.items i WHERE i.id::text = ANY($1)`})
		if err == nil || !strings.Contains(err.Error(), "event-fed") {
			t.Fatalf("defining the upgraded outbox's event-fed index: %v", err)
		}
	})
}
