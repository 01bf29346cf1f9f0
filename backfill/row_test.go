package backfill

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// A row whose version or deleted column cannot be read is that row's
// rejection, by its own id and with the column named; the rows around it
// arrive, and the stored progress counts it.
func TestBackfillRejectsUnreadableRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schemaName := schematest.Setup(t)
	table := `"` + schemaName + `".odd`
	for _, q := range []string{
		`CREATE TABLE ` + table + ` (id text PRIMARY KEY, num numeric, txt text, del boolean, title text NOT NULL)`,
		`INSERT INTO ` + table + ` VALUES
			('r1', 1, '1', false, 'one'),
			('r2', 1.5, 'abc', false, 'two'),
			('r3', NULL, NULL, false, 'three'),
			('r4', 2, '2', NULL, 'four'),
			('r5', 3, '3', true, 'five'),
			('r6', 4, '4', false, 'six')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		column string
		want   map[string]string // rejected id -> what its reason says
	}{
		{"num", map[string]string{"r2": "version: 1.5", "r3": "version: NULL", "r4": "deleted: NULL"}},
		{"txt", map[string]string{"r2": `version: "abc"`, "r3": "version: NULL", "r4": "deleted: NULL"}},
	} {
		t.Run("a version of type "+tc.column, func(t *testing.T) {
			es, name := tooltest.Index(t, "backfill-")
			rep, err := Run(ctx, Options{Pool: pool, Schema: schemaName, Index: name, Batch: 2, InFlight: 1,
				SourceSQL: `SELECT id, ` + tc.column + `, json_build_object('title', title), del FROM ` + table,
				Sink:      tooltest.NewSink(t, indexer.Options{Client: es})})
			if err != nil {
				t.Fatalf("the backfill stopped: %v (report %+v); want the unreadable rows rejected and the rest written", err, rep)
			}
			if rep.Rows != 6 || rep.Applied != 3 || rep.Rejected != 3 || len(rep.Samples) != 3 {
				t.Fatalf("report %+v; want 6 rows, 3 applied, 3 rejected", rep)
			}
			for _, s := range rep.Samples {
				if w, ok := tc.want[s.ID]; !ok || !strings.Contains(s.Reason, w) {
					t.Errorf("rejected %q: %q; want one of %v", s.ID, s.Reason, tc.want)
				}
			}
			docs := estest.SearchRead(t, es, name)
			if len(docs) != 2 || docs["r1"] == nil || docs["r6"] == nil {
				t.Fatalf("visible: %v; want r1 and r6 (r5 is deleted)", docs)
			}
			var rejected int64
			var finished bool
			if err := pool.QueryRow(ctx, `SELECT rejected, finished_at IS NOT NULL FROM "`+schemaName+`".backfills WHERE index_name = $1`, name).Scan(&rejected, &finished); err != nil || rejected != 3 || !finished {
				t.Fatalf("stored progress: %d rejected, finished %v, %v", rejected, finished, err)
			}
		})
	}
}
