package reconcile

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// A document with the index's reserved tombstone fields is refused by the
// row, naming its source_id and the field; the other fixes go on.
func TestReservedFieldsInRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("reconcile rejects that row and appends the other fixes", func(t *testing.T) {
		t.Parallel()
		pool, schemaName := schematest.Setup(t)
		ri := tooltest.NewFamily(t, false)
		table := `"` + schemaName + `".articles`
		if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY, version bigint NOT NULL, doc jsonb, deleted boolean NOT NULL DEFAULT false);
			INSERT INTO `+table+` VALUES ('good', 1, '{"title":"good"}', false), ('bad', 1, '{"title":"bad","outboxd_deleted_at":"2026-01-01T00:00:00Z"}', false)`); err != nil {
			t.Fatal(err)
		}
		rep, err := Run(ctx, Options{ES: ri.ES, DB: pool, Schema: schemaName, Index: ri.Name,
			SourceSQL: `SELECT id, version, doc, deleted FROM ` + table, Apply: true, Operator: "tester"})
		if err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
		if len(rep.Rejected) != 1 || rep.Rejected[0].ID != "bad" || !strings.Contains(rep.Rejected[0].Reason, "outboxd_deleted_at") {
			t.Fatalf("rejected %+v, want the row bad naming outboxd_deleted_at", rep.Rejected)
		}
		var sources []string
		rows, err := pool.Query(ctx, `SELECT source_id FROM "`+schemaName+`".events`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			sources = append(sources, s)
		}
		if len(sources) != 1 || sources[0] != "good" {
			t.Fatalf("appended fixes for %v, want only good", sources)
		}
	})
}
