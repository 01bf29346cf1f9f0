package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
)

// appendTx commits n events in one transaction (so that they become
// visible together, in one page) and returns their ids.
func (e *env) appendTx(t *testing.T, prefix string, n int) []int64 {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT "`+e.schema+`".append('items', $1 || i, 1, 'upsert', jsonb_build_object('n', i))
		FROM generate_series(1, $2) i`, prefix, n)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func waitFired(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// assertAllDelivered waits until the stream acknowledged everything and
// the last event arrived, then fails for each event the sink never got.
func (e *env) assertAllDelivered(t *testing.T, sink *recordingSink, ids []int64) {
	t.Helper()
	last := ids[len(ids)-1]
	schematest.Eventually(t, 60*time.Second, "backlog zero and the last event delivered", func() bool {
		return sink.has(last) && e.backlog(t) == 0
	})
	var missing []int64
	for _, id := range ids {
		if !sink.has(id) {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d events never reached the sink although the backlog is 0: %v", len(missing), len(ids), missing)
	}
}

// A connection lost after a page's rows arrived but before the answer to
// the read's COMMIT must not move the position: the page is read again.
func TestRelayReadCutBeforeCommit(t *testing.T) {
	t.Parallel()

	t.Run("a page whose COMMIT answer is lost is read again, not skipped", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		proxy, pool := newCutProxy(t)
		sink := newRecordingSink()
		cfg := e.config(sink)
		cfg.Pool = pool
		cfg.Linger = -1
		// The page of the 10 events is the only "SELECT 10": the cut
		// falls between its CommandComplete and COMMIT's.
		cut := proxy.after(1, true, commandComplete("SELECT 10"))
		stop := start(t, cfg)
		ids := e.appendTx(t, "a", 10)
		waitFired(t, cut, "the cut after the page's rows")
		// Later pages acknowledge past the cut one.
		ids = append(ids, e.appendTx(t, "b", 1)...)
		e.assertAllDelivered(t, sink, ids)
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	})

	t.Run("a read cut during a linger loses nothing of the lingering page or the cut one", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		proxy, pool := newCutProxy(t)
		sink := newRecordingSink()
		cfg := e.config(sink)
		cfg.Pool = pool
		// A long linger waiting for 15 events: after the page of 5 every
		// read that finds events is the linger's own.
		cfg.Linger, cfg.LingerDocs = 12*time.Second, 15
		lingering := proxy.after(1, false, commandComplete("SELECT 5"))
		cut := proxy.after(1, true, commandComplete("SELECT 10"))
		stop := start(t, cfg)
		ids := e.appendTx(t, "a", 5)
		waitFired(t, lingering, "the first page (the linger starts on it)")
		ids = append(ids, e.appendTx(t, "b", 10)...)
		waitFired(t, cut, "the cut of the linger's read")
		ids = append(ids, e.appendTx(t, "c", 5)...)
		e.assertAllDelivered(t, sink, ids)
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	})
}
