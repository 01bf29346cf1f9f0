package backfill

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/outbox"
)

// heldSink holds its first write until released, and says when that write
// has arrived: a backfill is then surely running, at a known point.
type heldSink struct {
	sink     *indexer.Sink
	arrived  chan struct{}
	released chan struct{}
	once     sync.Once
}

func newHeldSink(s *indexer.Sink) *heldSink {
	return &heldSink{sink: s, arrived: make(chan struct{}), released: make(chan struct{})}
}

func (h *heldSink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	h.once.Do(func() {
		close(h.arrived)
		select {
		case <-h.released:
		case <-ctx.Done():
		}
	})
	return h.sink.Write(ctx, events)
}

// runHeld starts a backfill with o whose first write waits in the sink;
// it returns once that write has arrived.
func runHeld(t *testing.T, o Options) (release func() (*Report, error)) {
	t.Helper()
	held := newHeldSink(o.Sink.(*indexer.Sink))
	o.Sink = held
	type result struct {
		rep *Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := Run(context.Background(), o)
		done <- result{rep, err}
	}()
	select {
	case <-held.arrived:
	case r := <-done:
		t.Fatalf("the held backfill ended before its first write: %+v, %v", r.rep, r.err)
	}
	var once sync.Once
	var r result
	release = func() (*Report, error) {
		once.Do(func() { close(held.released); r = <-done })
		return r.rep, r.err
	}
	t.Cleanup(func() { release() }) // never leave it running under the cleanup
	return release
}

func TestBackfillOneRunPerIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("while a backfill of an index runs, a second one, resumed or restarted, is refused naming the running one", func(t *testing.T) {
		t.Parallel()
		const rows = 600
		e := tooltest.NewSource(t, rows)
		o := opts(e, tooltest.NewSink(t, indexer.Options{Client: e.ES}))
		o.Batch = 50
		release := runHeld(t, o)

		for _, restart := range []bool{false, true} {
			second := o
			second.Restart = restart
			rep, err := Run(ctx, second)
			if err == nil || !strings.Contains(err.Error(), e.Name) || !strings.Contains(err.Error(), "another backfill of this index is running: run ") {
				t.Fatalf("restart %v: a second backfill beside the running one: %+v, %v; want it refused naming the index and the running run", restart, rep, err)
			}
		}
		rep, err := release()
		if err != nil || rep.Rows != rows || rep.Applied != rows {
			t.Fatalf("the first run: %+v, %v; want all %d rows", rep, err, rows)
		}
		if docs := estest.SearchRead(t, e.ES, e.Name); len(docs) != rows {
			t.Fatalf("%d documents visible, want %d", len(docs), rows)
		}
	})

	t.Run("a run whose lock's session is terminated stores nothing more, and the run that took over keeps its progress", func(t *testing.T) {
		t.Parallel()
		const rows = 600
		e := tooltest.NewSource(t, rows)
		o := opts(e, tooltest.NewSink(t, indexer.Options{Client: e.ES}))
		o.Batch = 50
		release := runHeld(t, o)

		var terminated int
		if err := e.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
WHERE locktype = 'advisory' AND classid = hashtext('outboxd.backfill')::oid AND objid = hashtext($1)::oid AND granted`,
			e.Schema+"."+e.Name).Scan(&terminated); err != nil || terminated != 1 {
			t.Fatalf("terminated %d sessions holding the backfill lock, %v; want the running backfill's one", terminated, err)
		}
		// pg_terminate_backend only signals the backend: wait until it has
		// exited and its lock is free, or the next run is refused for the
		// lock the dying session still holds.
		for deadline := time.Now().Add(30 * time.Second); ; {
			var held int
			if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND classid = hashtext('outboxd.backfill')::oid AND objid = hashtext($1)::oid AND granted`,
				e.Schema+"."+e.Name).Scan(&held); err != nil {
				t.Fatal(err)
			}
			if held == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the terminated session still holds the backfill lock after 30s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		second := o
		second.Restart = true
		rep, err := Run(ctx, second)
		if err != nil || rep.Rows != rows {
			t.Fatalf("the run after the lock was lost: %+v, %v; want all %d rows", rep, err, rows)
		}
		if first, err := release(); err == nil || !strings.Contains(err.Error(), "backfill lock") {
			t.Fatalf("the run that lost its lock: %+v, %v; want it stopped at its next progress write", first, err)
		}
		var last string
		var read int64
		var finished bool
		if err := e.Pool.QueryRow(ctx, `SELECT last_key, rows_read, finished_at IS NOT NULL FROM "`+e.Schema+`".backfills WHERE index_name = $1`, e.Name).
			Scan(&last, &read, &finished); err != nil || last != "a0000600" || read != rows || !finished {
			t.Fatalf("stored progress: last %q, %d rows, finished %v, %v; want the second run's, finished after a0000600", last, read, finished, err)
		}
	})
}
