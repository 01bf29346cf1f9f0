package backfill

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/tooltest"
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
	es, name := tooltest.Index(t, "backfill-")
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
		sink := &slowCounting{sink: tooltest.NewSink(t, indexer.Options{Client: es}), hold: 50 * time.Millisecond}
		rep, err := Run(ctx, Options{Pool: pool, Schema: schemaName, Index: name, Restart: true,
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

// bytesCounting records the largest batch, in bytes of ids and documents,
// the sink was handed.
type bytesCounting struct {
	sink          *indexer.Sink
	largest, rows atomic.Int64
}

func (s *bytesCounting) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	var n int64
	for _, e := range events {
		n += int64(len(e.SourceID) + len(e.Document))
	}
	for m := s.largest.Load(); n > m && !s.largest.CompareAndSwap(m, n); m = s.largest.Load() {
	}
	s.rows.Add(int64(len(events)))
	return s.sink.Write(ctx, events)
}

// A batch is bounded by bytes as well as by rows: large rows at the
// default --batch never make a batch larger than the byte bound.
func TestBackfillBatchBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	es, name := tooltest.Index(t, "backfill-")
	pool, schemaName := schematest.Setup(t)
	table := `"` + schemaName + `".large`
	const rowBytes, rows = 512 << 10, 24 // 12 MiB in all
	for _, q := range []string{
		`CREATE TABLE ` + table + ` (id bigint PRIMARY KEY, version bigint NOT NULL)`,
		`INSERT INTO ` + table + ` SELECT i, 1 FROM generate_series(1, ` + fmt.Sprint(rows) + `) i`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	sink := &bytesCounting{sink: tooltest.NewSink(t, indexer.Options{Client: es})}
	rep, err := Run(ctx, Options{Pool: pool, Schema: schemaName, Index: name, Sink: sink,
		SourceSQL: `SELECT id, version, json_build_object('body', repeat('x', ` + fmt.Sprint(rowBytes) + `)) FROM ` + table})
	if err != nil || rep.Rows != rows || rep.Applied != rows {
		t.Fatalf("%+v, %v; want %d rows applied", rep, err, rows)
	}
	if got := sink.largest.Load(); got > 8<<20 {
		t.Fatalf("a batch of %d bytes reached the sink; want at most the default bound of 8 MiB", got)
	}

	// Small rows first, then large ones: the FETCH sized by the small rows
	// returns more than a batch holds, and is cut, not held whole.
	sink = &bytesCounting{sink: tooltest.NewSink(t, indexer.Options{Client: es})}
	rep, err = Run(ctx, Options{Pool: pool, Schema: schemaName, Index: name, Sink: sink, Restart: true, BatchBytes: 1 << 20,
		SourceSQL: `SELECT id, version + 1, json_build_object('body', repeat('x', CASE WHEN id <= 12 THEN 1000 ELSE ` + fmt.Sprint(rowBytes) + ` END)) FROM ` + table})
	if err != nil || rep.Rows != rows || rep.Applied != rows || sink.rows.Load() != rows {
		t.Fatalf("%+v, %v; want %d rows applied, each sent once (sent %d)", rep, err, rows, sink.rows.Load())
	}
	if got := sink.largest.Load(); got > 1<<20 {
		t.Fatalf("a batch of %d bytes reached the sink; want at most --batch-bytes 1 MiB", got)
	}
}
