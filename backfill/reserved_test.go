package backfill

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
)

// A document with the index's reserved tombstone fields is refused by the
// row, naming its source_id and the field; the other rows go on.
func TestReservedFieldsInRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("backfill rejects that row and the others arrive", func(t *testing.T) {
		t.Parallel()
		e := tooltest.NewSource(t, 3)
		if _, err := e.Pool.Exec(ctx, `INSERT INTO `+e.Table+` VALUES ('bad', 1, 'x')`); err != nil {
			t.Fatal(err)
		}
		sink := tooltest.NewSink(t, indexer.Options{Client: e.ES})
		o := opts(e, sink)
		o.SourceSQL = `SELECT id, version, CASE WHEN id = 'bad' THEN json_build_object('title', title, 'outboxd_deleted', true) ELSE ` + tooltest.DocSQL + ` END FROM ` + e.Table
		rep, err := Run(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Rejected != 1 || len(rep.Samples) != 1 || rep.Samples[0].ID != "bad" || !strings.Contains(rep.Samples[0].Reason, "outboxd_deleted") {
			t.Fatalf("report %+v, want the row bad rejected naming outboxd_deleted", rep)
		}
		if docs := estest.SearchRead(t, e.ES, e.Name); len(docs) != 3 || docs["bad"] != nil {
			t.Fatalf("visible: %v", docs)
		}
	})
}
