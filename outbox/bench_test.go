package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// The write-side cost of the outbox: how much slower a business transaction
// gets when it also appends one event. Run with
//
//	go test -bench Outbox -run '^$' ./outbox/
//
// It needs the shared PostgreSQL; numbers from a busy shared server are
// noisy, so compare the ratio, which both phases share, rather than the
// absolute rates.

const benchClients = 8

var benchBody = strings.Repeat("lorem ipsum dolor sit amet ", 20)

// BenchmarkOutboxAppendOverhead runs the same business INSERT with and
// without one Append in the same transaction, 8 concurrent clients each,
// alternating the two phases so drift on the server hits both alike. Use
// a fixed count for stable numbers: -benchtime 8000x.
func BenchmarkOutboxAppendOverhead(b *testing.B) {
	benchAppendOverhead(b, setupOutbox(b), false)
}

// BenchmarkOutboxQueueOverhead is the same with the business INSERT and the
// event sent in one round trip (Outbox.Queue on the caller's pgx.Batch),
// against the same INSERT sent alone the same way.
func BenchmarkOutboxQueueOverhead(b *testing.B) {
	benchAppendOverhead(b, setupOutbox(b), true)
}

// benchAppendOverhead measures on e; pipelined sends the business INSERT
// and the Append in one round trip (Outbox.Queue).
func benchAppendOverhead(b *testing.B, e *outboxEnv, pipelined bool) {
	ctx := context.Background()
	table := e.outbox.Schema() + `.` + schematest.Name("bench_tutorials_")
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+table+` (
		id bigint PRIMARY KEY, title text NOT NULL, body text NOT NULL, version bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	var nextID atomic.Int64

	// one business transaction: the INSERT the application does anyway,
	// plus the event when withEvent.
	one := func(withEvent bool) error {
		id := nextID.Add(1)
		title := fmt.Sprintf("tutorial %d", id)
		insert := `INSERT INTO ` + table + ` (id, title, body, version) VALUES ($1, $2, $3, 1)`
		event := func() (outbox.Event, error) {
			doc, err := json.Marshal(map[string]any{"id": id, "title": title, "body": benchBody})
			return outbox.Event{
				IndexName: "tutorials", SourceID: fmt.Sprint(id), Version: 1, Op: outbox.OpUpsert,
				Document: doc, EventType: "tutorial.created",
			}, err
		}
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if pipelined {
				var batch pgx.Batch
				batch.Queue(insert, id, title, benchBody)
				if withEvent {
					ev, err := event()
					if err != nil {
						return err
					}
					if err := e.outbox.Queue(&batch, ev); err != nil {
						return err
					}
				}
				return tx.SendBatch(ctx, &batch).Close()
			}
			if _, err := tx.Exec(ctx, insert, id, title, benchBody); err != nil {
				return err
			}
			if !withEvent {
				return nil
			}
			ev, err := event()
			if err != nil {
				return err
			}
			_, err = e.outbox.Append(ctx, tx, ev)
			return err
		})
	}
	// phase runs n transactions over benchClients clients and returns the
	// wall time.
	phase := func(n int, withEvent bool) time.Duration {
		var left atomic.Int64
		left.Store(int64(n))
		var wg sync.WaitGroup
		var failed atomic.Value
		start := time.Now()
		for range benchClients {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					if err := one(withEvent); err != nil {
						failed.Store(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if err := failed.Load(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}

	// Warm the pool's connections and their statement caches.
	phase(4*benchClients, true)
	phase(4*benchClients, false)

	// Short alternating slices: load changes on a shared server then hit
	// both phases alike, and the ratio stays meaningful.
	per := 16 * benchClients
	rounds := max(b.N/per, 1)
	var plain, outbox time.Duration
	b.ResetTimer()
	for range rounds {
		plain += phase(per, false)
		outbox += phase(per, true)
	}
	b.StopTimer()
	total := float64(per * rounds)
	plainRate := total / plain.Seconds()
	outboxRate := total / outbox.Seconds()
	b.ReportMetric(plainRate, "plain-tx/s")
	b.ReportMetric(outboxRate, "outbox-tx/s")
	b.ReportMetric(outboxRate/plainRate, "ratio")
}

// BenchmarkOutboxAppendBatch measures AppendBatch through COPY: batches of
// 1000 explicitly versioned events, each batch in its own transaction.
func BenchmarkOutboxAppendBatch(b *testing.B) {
	e := setupOutbox(b)
	ctx := context.Background()
	const size = 1000
	batch := make([]outbox.Event, size)
	for i := range batch {
		batch[i] = outbox.Event{
			IndexName: "tutorials", SourceID: fmt.Sprintf("tut-%d", i), Version: 1, Op: outbox.OpUpsert,
			Document:  json.RawMessage(fmt.Sprintf(`{"id": %d, "title": "tutorial %d", "body": %q}`, i, i, benchBody)),
			EventType: "tutorial.created",
		}
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		for j := range batch {
			batch[j].Version = int64(i + 1)
		}
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			n, err := e.outbox.AppendBatch(ctx, tx, batch)
			if err == nil && n != size {
				err = fmt.Errorf("wrote %d of %d", n, size)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*size)/time.Since(start).Seconds(), "events/s")
}
