package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/source"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// failingAfter passes the first n writes to the sink and then fails like
// an unreachable cluster.
type failingAfter struct {
	sink   *indexer.Sink
	n      int64
	writes atomic.Int64
}

func (f *failingAfter) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	if f.writes.Add(1) > f.n {
		return nil, &indexer.UnavailableError{Err: errors.New("gone")}
	}
	return f.sink.Write(ctx, events)
}

func TestBackfillKeyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("an integer key is read through its index in numeric order, and a backfill stopped after a batch continues after it (2 < 10)", func(t *testing.T) {
		t.Parallel()
		es, name := tooltest.Index(t, "backfill-")
		pool, schemaName := schematest.Setup(t)
		table := `"` + schemaName + `".numbered`
		for _, q := range []string{
			`CREATE TABLE ` + table + ` (id bigint PRIMARY KEY, version bigint NOT NULL, title text NOT NULL)`,
			`INSERT INTO ` + table + ` SELECT i, 1, 'title ' || i FROM generate_series(1, 25) i`,
			`ANALYZE ` + table,
		} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		sourceSQL := `SELECT id, version, json_build_object('title', title) FROM ` + table
		sink := tooltest.NewSink(t, indexer.Options{Client: es})
		o := Options{Pool: pool, Schema: schemaName, Index: name, SourceSQL: sourceSQL, Batch: 10, InFlight: 1,
			OutageTimeout: 200 * time.Millisecond, Sink: &failingAfter{sink: sink, n: 1}}
		first, err := Run(ctx, o)
		var unavailable *indexer.UnavailableError
		if !errors.As(err, &unavailable) || first.Rows != 10 {
			t.Fatalf("first run: %+v, %v; want 10 rows, then the sink gone", first, err)
		}
		var last string
		if err := pool.QueryRow(ctx, `SELECT last_key FROM "`+schemaName+`".backfills WHERE index_name = $1`, name).Scan(&last); err != nil || last != "10" {
			t.Fatalf("stored key %q, %v; want 10 (the first ten ids in numeric order)", last, err)
		}

		o.Sink = sink
		second, err := Run(ctx, o)
		if err != nil || second.From != "10" || second.Rows != 15 || second.Applied != 15 {
			t.Fatalf("second run: %+v, %v; want ids 11..25 after 10", second, err)
		}
		if docs := estest.SearchRead(t, es, name); len(docs) != 25 || docs["2"] == nil || docs["25"] == nil {
			t.Fatalf("%d documents visible, want 25", len(docs))
		}

		// The resumed cursor reads the primary key's index from the stored
		// key on: no sort before the first row, whatever the table's size.
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
			t.Fatal(err)
		}
		plan := explainCursor(t, tx, sourceSQL, "10")
		if strings.Contains(plan, "Sort") || !strings.Contains(plan, "numbered_pkey") || !strings.Contains(plan, "Index Cond") {
			t.Fatalf("the resumed cursor does not read the key's index in order:\n%s", plan)
		}
	})

	t.Run("a key without an ordering of its own is read in the order of its text, and resumes", func(t *testing.T) {
		t.Parallel()
		es, name := tooltest.Index(t, "backfill-")
		pool, schemaName := schematest.Setup(t)
		// A json id has no btree ordering: its text, in byte order.
		sourceSQL := `SELECT to_json(i), 1, json_build_object('n', i) FROM generate_series(1, 12) i`
		sink := tooltest.NewSink(t, indexer.Options{Client: es})
		o := Options{Pool: pool, Schema: schemaName, Index: name, SourceSQL: sourceSQL, Batch: 5, InFlight: 1,
			OutageTimeout: 200 * time.Millisecond, Sink: &failingAfter{sink: sink, n: 1}}
		if first, err := Run(ctx, o); err == nil || first.Rows != 5 {
			t.Fatalf("first run: %+v, %v", first, err)
		}
		o.Sink = sink
		second, err := Run(ctx, o)
		// "1", "10", "11", "12", "2" first; then "3".."9".
		if err != nil || second.From != "2" || second.Rows != 7 {
			t.Fatalf("second run: %+v, %v", second, err)
		}
		if docs := estest.SearchRead(t, es, name); len(docs) != 12 {
			t.Fatalf("%d documents visible, want 12", len(docs))
		}
	})
}

// A char(n) key resumes after the stored key in its own type: cast to
// bare character (one character) it would compare as its first letter,
// and the resumed run would read the table from the start again.
func TestBackfillResumesCharKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	es, name := tooltest.Index(t, "backfill-")
	pool, schemaName := schematest.Setup(t)
	table := `"` + schemaName + `".coded`
	for _, q := range []string{
		`CREATE TABLE ` + table + ` (id char(8) PRIMARY KEY, version bigint NOT NULL, title text NOT NULL)`,
		`INSERT INTO ` + table + ` SELECT 'k' || lpad(i::text, 3, '0'), 1, 'title ' || i FROM generate_series(1, 25) i`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	sink := tooltest.NewSink(t, indexer.Options{Client: es})
	o := Options{Pool: pool, Schema: schemaName, Index: name, Batch: 10, InFlight: 1, OutageTimeout: 200 * time.Millisecond,
		SourceSQL: `SELECT id, version, json_build_object('title', title) FROM ` + table, Sink: &failingAfter{sink: sink, n: 1}}
	if first, err := Run(ctx, o); err == nil || first.Rows != 10 {
		t.Fatalf("first run: %+v, %v; want 10 rows, then the sink gone", first, err)
	}
	o.Sink = sink
	second, err := Run(ctx, o)
	if err != nil || second.From != "k010" || second.Rows != 15 || second.Applied != 15 || second.Stale != 0 {
		t.Fatalf("second run: %+v, %v; want k011..k025 after k010, none read again", second, err)
	}
	if docs := estest.SearchRead(t, es, name); len(docs) != 25 || docs["k001"] == nil || docs["k025"] == nil {
		t.Fatalf("%d documents visible, want 25", len(docs))
	}
}

// explainCursor is the plan of the cursor a resumed backfill of sourceSQL
// declares, as text.
func explainCursor(t *testing.T, tx pgx.Tx, sourceSQL, after string) string {
	t.Helper()
	ctx := context.Background()
	shape, err := source.Describe(ctx, tx, sourceSQL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('outboxd.backfill_after', $1, true)`, after); err != nil {
		t.Fatal(err)
	}
	q := strings.Replace(source.CursorSQL(sourceSQL, shape.KeyType, shape.Cols, true), "DECLARE outboxd_backfill NO SCROLL CURSOR FOR", "EXPLAIN (FORMAT JSON)", 1)
	var plan json.RawMessage
	if err := tx.QueryRow(ctx, q).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	return string(plan)
}
