package backfill

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/schema/schematest"
)

// The command builds its sink with indexer.Options.JSONB from ValidJSON:
// only a column PostgreSQL validated may skip the sink's parse.
func TestValidJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := schematest.Pool(t)
	for _, c := range []struct {
		what, sql string
		want      bool
	}{
		{"a jsonb document column is valid JSON", `SELECT 1, 1, '{}'::jsonb`, true},
		{"a json document column is valid JSON", `SELECT 1, 1, json_build_object('a', 1), false`, true},
		{"a text document column is not", `SELECT 1, 1, '{"a":'::text`, false},
	} {
		t.Run(c.what, func(t *testing.T) {
			got, err := ValidJSON(ctx, pool, c.sql)
			if err != nil || got != c.want {
				t.Fatalf("ValidJSON(%s) = %t, %v; want %t", c.sql, got, err, c.want)
			}
		})
	}
	t.Run("a query of the wrong shape is refused as Run refuses it", func(t *testing.T) {
		if _, err := ValidJSON(ctx, pool, `SELECT 1, 1`); err == nil || !strings.Contains(err.Error(), "returns 2 columns") {
			t.Fatalf("err %v, want the column count named", err)
		}
	})
}
