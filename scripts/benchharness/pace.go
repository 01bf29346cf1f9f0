package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
)

// pace hands g = 1..rate*d to workers at rate per second, each calling
// commit(g), for d: workers that fall behind make the achieved rate lower
// (the caller reports it), not the phase longer; what they have not begun
// by then is dropped. It returns how many were committed and the time it
// took.
func pace(ctx context.Context, rate int, d time.Duration, workers int, commit func(g int64) error) (int, time.Duration, error) {
	total := int(float64(rate) * d.Seconds())
	jobs := make(chan int64, rate)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	var done atomic.Int64
	start := time.Now()
	deadline := start.Add(d)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := range jobs {
				if time.Now().After(deadline) {
					continue
				}
				if err := commit(g); err != nil {
					failed.CompareAndSwap(nil, &err)
					continue
				}
				done.Add(1)
			}
		}()
	}
	interval := time.Second / time.Duration(rate)
	for i := range total {
		if dl := time.Until(start.Add(time.Duration(i) * interval)); dl > 0 {
			time.Sleep(dl)
		}
		if ctx.Err() != nil || failed.Load() != nil || time.Now().After(deadline) {
			break
		}
		jobs <- int64(i + 1)
	}
	close(jobs)
	wg.Wait()
	took := time.Since(start)
	if p := failed.Load(); p != nil {
		return int(done.Load()), took, fmt.Errorf("producer: %w", *p)
	}
	return int(done.Load()), took, ctx.Err()
}

// ackTimes records, by event number g (source id doc-g), the producer's
// commit time and the moment Elasticsearch answered the bulk request that
// carried it.
type ackTimes struct {
	commit []atomic.Int64
	ack    []atomic.Int64
	acked  atomic.Int64 // distinct events acknowledged
}

func newAckTimes(n int) *ackTimes {
	return &ackTimes{commit: make([]atomic.Int64, n+1), ack: make([]atomic.Int64, n+1)}
}

// watch makes p report to a; the returned func stops it.
func (a *ackTimes) watch(p *esProxy) func() {
	fn := func(id []byte, at int64) {
		num, ok := bytes.CutPrefix(id, []byte("doc-"))
		if !ok {
			return
		}
		g, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil || g < 0 || g >= int64(len(a.ack)) {
			return
		}
		if a.ack[g].CompareAndSwap(0, at) {
			a.acked.Add(1)
		}
	}
	p.onAck.Store(&fn)
	return func() { p.onAck.Store(nil) }
}

// waitAcked waits until n distinct events are acknowledged, or timeout.
func (a *ackTimes) waitAcked(ctx context.Context, n int64, timeout time.Duration, relay *relayProc) error {
	deadline := time.Now().Add(timeout)
	for a.acked.Load() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d events acknowledged by Elasticsearch after %s", a.acked.Load(), n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-relay.exited:
			return fmt.Errorf("outboxd relay exited: %v: %s", relay.err, relay.log.String())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// appendEvent commits one event the way README recommends for Go:
// Outbox.Append in the caller's pgx transaction.
// appendEvents commits events first .. first+n-1 in one transaction.
func (b *bench) appendEvents(ctx context.Context, ob *outbox.Outbox, index string, first int64, n int) error {
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for g := first; g < first+int64(n); g++ {
			if _, err := ob.Append(ctx, tx, outbox.Event{IndexName: index, SourceID: sourceID(g), Version: 1, Op: outbox.OpUpsert, Document: rawDoc(g)}); err != nil {
				return err
			}
		}
		return nil
	})
}

func (b *bench) appendEvent(ctx context.Context, ob *outbox.Outbox, index string, g int64, doc []byte) error {
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := ob.Append(ctx, tx, outbox.Event{IndexName: index, SourceID: sourceID(g), Version: 1, Op: outbox.OpUpsert, Document: doc})
		return err
	})
}
