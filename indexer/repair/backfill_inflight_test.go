package repair

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// slowCounting holds every write a moment and records how many were at the
// sink at once.
type slowCounting struct {
	sink      *indexer.Sink
	now, most atomic.Int64
	hold      time.Duration
	writes    atomic.Int64
}

func (s *slowCounting) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	s.writes.Add(1)
	time.Sleep(s.hold)
	return s.sink.Write(ctx, events)
}

// The memory a backfill holds is bounded by --in-flight batches at the sink
// (plus the one being read): never one more.
func TestBackfillInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	es, name := backfillIndex(t)
	pool, schemaName := schematest.Setup(t)
	table := `"` + schemaName + `".rows`
	for _, q := range []string{
		`CREATE TABLE ` + table + ` (id bigint PRIMARY KEY, version bigint NOT NULL, title text NOT NULL)`,
		`INSERT INTO ` + table + ` SELECT i, 1, 'title ' || i FROM generate_series(1, 60) i`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, inFlight := range []int64{1, 2} {
		sink := &slowCounting{sink: newSink(t, indexer.Options{Client: es}), hold: 50 * time.Millisecond}
		rep, err := Backfill(ctx, BackfillOptions{Pool: pool, Schema: schemaName, Index: name, Restart: true,
			SourceSQL: `SELECT id, version, json_build_object('title', title) FROM ` + table,
			Batch:     5, InFlight: int(inFlight), Sink: sink})
		if err != nil || rep.Rows != 60 {
			t.Fatalf("in flight %d: %+v, %v; want 60 rows", inFlight, rep, err)
		}
		if got := sink.most.Load(); got != inFlight {
			t.Errorf("in flight %d: %d batches were at the sink at once (of %d writes)", inFlight, got, sink.writes.Load())
		}
	}
}
