package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// walScenario compares the WAL the relay writes per event with the WAL
// the producer wrote for the same event. pg_current_wal_insert_lsn is
// cluster-wide, so other engineers' writes can only inflate a sample:
// every quantity is measured several times and the minimum is kept.
func (b *bench) walScenario(ctx context.Context) error {
	cfg := b.cfg
	s, err := b.newSchema(ctx)
	if err != nil {
		return err
	}
	idle, err := b.idleWAL(ctx, 2*time.Second)
	if err != nil {
		return err
	}
	b.rep.line("background WAL of other sessions: %.0f bytes/s", idle)
	attr, err := newWALAttributor(ctx, b.pool)
	if err != nil {
		b.rep.line("pg_waldump attribution unavailable (%v): raw LSN differences only, minimum of samples", err)
	} else {
		b.rep.line("WAL attributed with pg_waldump: records on the bench schema's relations + their transactions' commit records")
	}
	// measure runs fn and returns the WAL per event: attributed when
	// possible, and the raw LSN difference.
	measure := func(n int, fn func() error) (float64, float64, error) {
		l0, err := walLSN(ctx, b.pool)
		if err != nil {
			return 0, 0, err
		}
		if err := fn(); err != nil {
			return 0, 0, err
		}
		l1, err := walLSN(ctx, b.pool)
		if err != nil {
			return 0, 0, err
		}
		raw := float64(l1-l0) / float64(n)
		if attr == nil {
			return raw, raw, nil
		}
		a, err := attr.bytes(ctx, b.pool, s, l0, l1)
		if err != nil {
			// Someone's checkpoint recycled the segment already: this
			// sample is the raw difference (only ever too high).
			b.rep.line("pg_waldump could not read this sample (%v); using the raw LSN difference", err)
			return raw, raw, nil
		}
		return float64(a) / float64(n), raw, nil
	}

	// The producer in batches, as the backlog is loaded, in 4 chunks.
	chunks := 4
	per := max(cfg.walN/chunks, 1)
	batch, batchRaw := math.Inf(1), math.Inf(1)
	loaded := 0
	for i := range chunks {
		n := per
		if i == chunks-1 {
			n = cfg.walN - loaded
		}
		if n <= 0 {
			break
		}
		a, r, err := measure(n, func() error {
			_, err := load(ctx, b.pool, s, "bench", int64(loaded+1), int64(n), cfg.loadTx, cfg.loadWorkers, false)
			return err
		})
		if err != nil {
			return err
		}
		batch, batchRaw = math.Min(batch, a), math.Min(batchRaw, r)
		loaded += n
	}
	// The producer as an application writes: one event per transaction.
	const single = 2000
	one, oneRaw := math.Inf(1), math.Inf(1)
	for range 2 {
		a, r, err := measure(single, func() error { return appendSingles(ctx, b, s, int64(loaded+1), single) })
		if err != nil {
			return err
		}
		one, oneRaw = math.Min(one, a), math.Min(oneRaw, r)
		loaded += single
	}
	b.rep.line("producer WAL per event: %.0f bytes appending %d per transaction (raw LSN min %.0f); %.0f bytes one per transaction (raw LSN min %.0f)",
		batch, cfg.loadTx, batchRaw, one, oneRaw)

	id, _ := schema.Ident(s)
	rel, relRaw := math.Inf(1), math.Inf(1)
	var samples []string
	for r := range cfg.walRepeat {
		if r > 0 {
			// A fresh stream reads the whole outbox again.
			if _, err := b.pool.Exec(ctx, `DELETE FROM `+id+`.progress`); err != nil {
				return err
			}
		}
		a, raw, err := measure(loaded, func() error {
			_, err := b.runChild(ctx, s, loaded, cfg.pageDocs, "")
			return err
		})
		if err != nil {
			return err
		}
		samples = append(samples, fmt.Sprintf("%.2f (raw %.1f)", a, raw))
		rel, relRaw = math.Min(rel, a), math.Min(relRaw, raw)
	}
	b.rep.line("relay WAL per event over %d drains of %d events: %s", cfg.walRepeat, loaded, strings.Join(samples, ", "))
	b.rep.key("wal: relay %.2f bytes/event; producer %.0f bytes/event batched -> ratio %.4fx (vs one event per transaction: %.4fx); raw LSN minima: %.4fx",
		rel, batch, rel/batch, rel/one, relRaw/batchRaw)
	b.rep.goal(rel/batch <= 0.1, "relay WAL <= 0.1x producer WAL: %.4fx", rel/batch)
	return nil
}

// idleWAL is the cluster's WAL rate while this run writes nothing.
func (b *bench) idleWAL(ctx context.Context, d time.Duration) (float64, error) {
	l0, err := walLSN(ctx, b.pool)
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	l1, err := walLSN(ctx, b.pool)
	if err != nil {
		return 0, err
	}
	return float64(l1-l0) / d.Seconds(), nil
}

// appendSingles commits n events, one Append per transaction, from 4
// connections.
func appendSingles(ctx context.Context, b *bench, schemaName string, from int64, n int) error {
	ob, err := outbox.NewOutbox(schemaName)
	if err != nil {
		return err
	}
	var next atomic.Int64
	next.Store(from)
	errc := make(chan error, 4)
	for range 4 {
		go func() {
			for {
				g := next.Add(1) - 1
				if g >= from+int64(n) {
					errc <- nil
					return
				}
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					_, err := ob.Append(ctx, tx, outbox.Event{IndexName: "bench", SourceID: sourceID(g), Version: 1, Op: outbox.OpUpsert, Document: rawDoc(g)})
					return err
				})
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var first error
	for range 4 {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}
