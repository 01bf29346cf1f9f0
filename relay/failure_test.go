package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

func TestRelayFailures(t *testing.T) {
	t.Parallel()

	t.Run("a sink that is down makes the backlog grow, then it drains completely", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		sink.setDown(true)
		start(t, e.config(sink))
		ids := e.append(t, 300)
		schematest.Eventually(t, 10*time.Second, "backlog of 300", func() bool { return e.backlog(t) == 300 })
		time.Sleep(300 * time.Millisecond) // several failed attempts
		if n := sink.delivered(); n != 0 {
			t.Fatalf("delivered %d while down", n)
		}
		sink.setDown(false)
		schematest.Eventually(t, 20*time.Second, "backlog drained", func() bool { return e.backlog(t) == 0 })
		for _, id := range ids {
			if !sink.has(id) {
				t.Fatalf("event %d lost", id)
			}
		}
		var dead int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".dead_letters`).Scan(&dead); err != nil {
			t.Fatal(err)
		}
		if dead != 0 {
			t.Fatalf("an outage dead-lettered %d events", dead)
		}
	})

	t.Run("a rejected event is dead-lettered with its reason and later events flow", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		sink.outcome = func(ev outbox.Event) outbox.Outcome {
			if ev.SourceID == "s3" {
				return outbox.Outcome{Status: outbox.Rejected, Reason: "mapper_parsing_exception: field [n] of type long"}
			}
			return outbox.Outcome{Status: outbox.Applied}
		}
		start(t, e.config(sink))
		ids := e.append(t, 10)
		schematest.Eventually(t, 10*time.Second, "later events delivered", func() bool { return sink.has(ids[9]) && e.backlog(t) == 0 })
		var reason, source string
		var attempts int
		err := e.pool.QueryRow(context.Background(), `SELECT source_id, reason, attempts FROM "`+e.schema+`".dead_letters`).Scan(&source, &reason, &attempts)
		if err != nil {
			t.Fatal(err)
		}
		if source != "s3" || !strings.Contains(reason, "mapper_parsing_exception") || attempts != 1 {
			t.Fatalf("dead letter = %s %q attempts=%d", source, reason, attempts)
		}
	})

	t.Run("an event failing transiently past the attempt limit is dead-lettered, not retried forever", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		var tries atomic.Int64
		sink.outcome = func(ev outbox.Event) outbox.Outcome {
			if ev.SourceID == "s1" {
				tries.Add(1)
				return outbox.Outcome{Status: outbox.Retry, Reason: "es_rejected_execution_exception (429)"}
			}
			return outbox.Outcome{Status: outbox.Applied}
		}
		cfg := e.config(sink)
		cfg.MaxAttempts = 4
		start(t, cfg)
		ids := e.append(t, 3)
		schematest.Eventually(t, 10*time.Second, "backlog drained", func() bool { return sink.has(ids[2]) && e.backlog(t) == 0 })
		var reason, kind string
		var attempts int
		if err := e.pool.QueryRow(context.Background(), `SELECT reason, attempts, kind FROM "`+e.schema+`".dead_letters WHERE source_id = 's1'`).Scan(&reason, &attempts, &kind); err != nil {
			t.Fatal(err)
		}
		if attempts != 4 || tries.Load() != 4 || !strings.Contains(reason, "gave up after 4 attempts") || kind != relay.KindGaveUp {
			t.Fatalf("attempts=%d tries=%d reason=%q kind=%q", attempts, tries.Load(), reason, kind)
		}
	})

	t.Run("a progress write that keeps failing never moves progress; the stream is given up and retried, never exits", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		ctx := context.Background()
		stop := start(t, e.config(sink))
		first := e.append(t, 5)
		schematest.Eventually(t, 10*time.Second, "first events acknowledged", func() bool { return e.backlog(t) == 0 && sink.has(first[4]) })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		var before string
		if err := e.pool.QueryRow(ctx, `SELECT done_snapshot::text FROM "`+e.schema+`".progress`).Scan(&before); err != nil {
			t.Fatal(err)
		}
		// Every store fails and counts itself (nextval outlives the rollback).
		_, err := e.pool.Exec(ctx, `CREATE SEQUENCE "`+e.schema+`".denied;
			CREATE FUNCTION "`+e.schema+`".deny() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN PERFORM nextval('"`+e.schema+`".denied'); RAISE EXCEPTION 'progress is read-only for this test'; END $$;
			CREATE TRIGGER deny BEFORE UPDATE ON "`+e.schema+`".progress FOR EACH ROW EXECUTE FUNCTION "`+e.schema+`".deny()`)
		if err != nil {
			t.Fatal(err)
		}
		rn := runUntilStopped(t, e.config(sink))
		e.append(t, 5)
		denied := func() int64 {
			var n int64
			if err := e.pool.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM "`+e.schema+`".denied`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		// Three failed stores: the stream was given up and led again twice.
		schematest.Eventually(t, 20*time.Second, "three failed progress stores", func() bool { rn.alive(t); return denied() >= 3 })
		rn.alive(t)
		var after string
		if err := e.pool.QueryRow(ctx, `SELECT done_snapshot::text FROM "`+e.schema+`".progress`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Fatalf("progress moved from %s to %s although it could not be written", before, after)
		}
		if n := e.backlog(t); n != 5 {
			t.Fatalf("backlog = %d, want the 5 unacknowledged events", n)
		}
		if _, err := e.pool.Exec(ctx, `DROP TRIGGER deny ON "`+e.schema+`".progress`); err != nil {
			t.Fatal(err)
		}
		schematest.Eventually(t, 20*time.Second, "the events are acknowledged once progress can be stored", func() bool { rn.alive(t); return e.backlog(t) == 0 })
		rn.stop(t)
	})

	t.Run("graceful shutdown persists progress and a restart re-delivers nothing acknowledged", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		stop := start(t, e.config(sink))
		ids := e.append(t, 200)
		schematest.Eventually(t, 10*time.Second, "all delivered", func() bool { return sink.delivered() == len(ids) })
		if err := stop(); err != nil {
			t.Fatalf("graceful shutdown: %v", err)
		}
		if n := e.backlog(t); n != 0 {
			t.Fatalf("backlog after graceful shutdown = %d", n)
		}
		again := newRecordingSink()
		start(t, e.config(again))
		more := e.append(t, 1)
		schematest.Eventually(t, 10*time.Second, "new event delivered after restart", func() bool { return again.has(more[0]) })
		if n := again.delivered(); n != 1 {
			t.Fatalf("restart re-delivered %d acknowledged events", n-1)
		}
	})

	t.Run("with one page in flight, events of one source reach the sink in version order unless transaction ids order them otherwise", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		cfg := e.config(sink)
		cfg.MaxBatchDocs = 7 // many pages and batches
		cfg.InFlight = 1     // order across pages is only kept with one page at the sink
		start(t, cfg)
		ctx := context.Background()
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 50 {
					_, err := e.outbox.Append(ctx, e.pool, outbox.Event{IndexName: "items", SourceID: fmt.Sprintf("w%d", w%2), Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)})
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		schematest.Eventually(t, 20*time.Second, "all delivered", func() bool { return sink.delivered() == 200 })
		sink.mu.Lock()
		defer sink.mu.Unlock()
		// A read delivers its snapshot's events in transaction-id order, and
		// two writers of one source can take their ids in one order and
		// their versions (commit order) in the other: under load this test
		// saw "version 1 (xid 5469342) after 2 (xid 5469339)". What must
		// never happen is an event that comes later by both: a re-delivery
		// or an event read out of place.
		seen := map[string][]outbox.Event{}
		for _, ev := range sink.seen {
			if n := sink.count[ev.ID]; n != 1 {
				t.Fatalf("event %d delivered %d times", ev.ID, n)
			}
			for _, prev := range seen[ev.SourceID] {
				if ev.Version < prev.Version && ev.XID < prev.XID {
					t.Fatalf("source %s: version %d (event %d, xid %d) delivered after version %d (event %d, xid %d)",
						ev.SourceID, ev.Version, ev.ID, ev.XID, prev.Version, prev.ID, prev.XID)
				}
			}
			seen[ev.SourceID] = append(seen[ev.SourceID], ev)
		}
	})

	t.Run("reusing a stream name with another index filter is refused, never skipping the events it left out", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		cfg := e.config(sink)
		cfg.Streams = []relay.Stream{{Name: "s", BucketLo: 0, BucketHi: 1023, Indexes: []string{"a"}}}
		stop := start(t, cfg)
		ctx := context.Background()
		idA, _ := e.outbox.Append(ctx, e.pool, outbox.Event{IndexName: "a", SourceID: "x", Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)})
		schematest.Eventually(t, 10*time.Second, "a delivered", func() bool { return sink.has(idA) })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		cfg.Streams[0].Indexes = nil
		cfg.Registerer = prometheus.NewRegistry()
		r, err := relay.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := r.Run(runCtx); err == nil || !strings.Contains(err.Error(), "index filter") {
			t.Fatalf("Run = %v, want a refusal naming the index filter", err)
		}
	})

	t.Run("a stored position ahead of the database's transaction counter stops the stream", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		ctx := context.Background()
		_, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".progress (stream, done_snapshot) VALUES ('default', '900000000000:900000000000:')`)
		if err != nil {
			t.Fatal(err)
		}
		r, err := relay.New(e.config(sink))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		err = r.Run(runCtx)
		var pe *relay.PositionError
		if !errors.As(err, &pe) {
			t.Fatalf("Run = %v, want a PositionError", err)
		}
	})

	t.Run("a sink outage reported per event is retried past the attempt limit, never dead-lettered", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		var calls atomic.Int64
		sink.outcome = func(ev outbox.Event) outbox.Outcome {
			if calls.Add(1) <= 12 {
				return outbox.Outcome{Status: outbox.Retry, Reason: "bulk: 503 cluster_block_exception", Outage: true}
			}
			return outbox.Outcome{Status: outbox.Applied}
		}
		cfg := e.config(sink)
		cfg.MaxAttempts = 3
		start(t, cfg)
		ids := e.append(t, 1)
		schematest.Eventually(t, 20*time.Second, "delivered after the outage", func() bool { return sink.has(ids[0]) })
		var dead int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".dead_letters`).Scan(&dead); err != nil {
			t.Fatal(err)
		}
		if dead != 0 {
			t.Fatalf("an outage dead-lettered %d events", dead)
		}
	})
}
