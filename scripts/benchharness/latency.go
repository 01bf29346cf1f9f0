package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// recordingSink notes when each event id first arrives.
type recordingSink struct {
	recv []atomic.Int64 // unix nanos, by event id
	n    atomic.Int64
	ok   []outbox.Outcome
}

func (s *recordingSink) Write(_ context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	now := time.Now().UnixNano()
	for _, e := range events {
		if e.ID >= 0 && e.ID < int64(len(s.recv)) && s.recv[e.ID].CompareAndSwap(0, now) {
			s.n.Add(1)
		}
	}
	if len(s.ok) < len(events) {
		s.ok = make([]outbox.Outcome, len(events))
		for i := range s.ok {
			s.ok[i] = outbox.Outcome{Status: outbox.Applied}
		}
	}
	return s.ok[:len(events)], nil
}

type latResult struct {
	n         int
	open      time.Duration // how long the producer ran (and the long transaction stayed open)
	achieved  float64       // events/s actually committed
	p50, p99  time.Duration
	p999, max time.Duration
	windows   []string // p99 per window of the run, to show a trend

	progressBytes int64 // size of the progress table at the end
}

func (b *bench) latencyScenario(ctx context.Context) error {
	cfg := b.cfg
	b.rep.line("producer: %d events/s, one event per transaction from %d connections; relay defaults (poll 2ms..100ms); %s measured after %s warm-up",
		cfg.latRate, cfg.latWorkers, cfg.latDuration, cfg.latWarmup)
	base, err := b.latencyPhase(ctx, false)
	if err != nil {
		return err
	}
	b.rep.key("latency: p50 %s p99 %s (p99.9 %s, max %s) over %d events at %.0f/s",
		ms(base.p50), ms(base.p99), ms(base.p999), ms(base.max), base.n, base.achieved)
	b.rep.line("p99 per window: %s; progress table %d kB at the end", strings.Join(base.windows, "  "), base.progressBytes/1024)
	long, err := b.latencyPhase(ctx, true)
	if err != nil {
		return err
	}
	b.rep.key("latency with a write transaction open for the whole %s: p50 %s p99 %s (p99.9 %s, max %s) over %d events at %.0f/s",
		long.open.Round(time.Second), ms(long.p50), ms(long.p99), ms(long.p999), ms(long.max), long.n, long.achieved)
	b.rep.line("p99 per window: %s; progress table %d kB at the end", strings.Join(long.windows, "  "), long.progressBytes/1024)
	ratio := float64(long.p99) / float64(base.p99)
	b.rep.key("latency: ratio p99 long-transaction/baseline = %.2fx", ratio)
	b.rep.goal(base.p99 <= 50*time.Millisecond, "p99 commit->sink <= 50 ms: %s", ms(base.p99))
	b.rep.goal(long.p99 <= 50*time.Millisecond && ratio <= 2, "p99 with a long transaction <= 50 ms and <= 2x: %s, %.2fx", ms(long.p99), ratio)
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }

func (b *bench) latencyPhase(ctx context.Context, longTx bool) (latResult, error) {
	cfg := b.cfg
	s, err := b.newSchema(ctx)
	if err != nil {
		return latResult{}, err
	}
	ob, err := outbox.NewOutbox(s)
	if err != nil {
		return latResult{}, err
	}
	total := int(float64(cfg.latRate) * (cfg.latWarmup + cfg.latDuration).Seconds())
	capacity := total + 1000
	sink := &recordingSink{recv: make([]atomic.Int64, capacity)}
	commits := make([]atomic.Int64, capacity)

	// The relay reads through a pool of its own, as in its own process.
	rpool, err := pgxpool.New(ctx, b.url)
	if err != nil {
		return latResult{}, err
	}
	defer rpool.Close()
	r, err := relay.New(relay.Config{Pool: rpool, Schema: s, Sink: sink, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return latResult{}, err
	}
	rctx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayErr := make(chan error, 1)
	go func() { relayErr <- r.Run(rctx) }()

	appendOne := func(g int64) (int64, error) {
		var id int64
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			id, err = ob.Append(ctx, tx, outbox.Event{IndexName: "bench", SourceID: sourceID(g), Version: 1, Op: outbox.OpUpsert, Document: rawDoc(g)})
			return err
		})
		return id, err
	}
	// Wait until the relay leads and delivers.
	first, err := appendOne(0)
	if err != nil {
		return latResult{}, err
	}
	for sink.recv[first].Load() == 0 {
		select {
		case err := <-relayErr:
			return latResult{}, fmt.Errorf("relay stopped: %v", err)
		case <-ctx.Done():
			return latResult{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}

	if longTx {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return latResult{}, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		var xid uint64
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid); err != nil {
			return latResult{}, err
		}
	}

	jobs := make(chan int64, cfg.latRate)
	var wg sync.WaitGroup
	var prodErr atomic.Pointer[error]
	for range cfg.latWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := range jobs {
				id, err := appendOne(g)
				if err != nil {
					prodErr.CompareAndSwap(nil, &err)
					continue
				}
				if id < int64(capacity) {
					commits[id].Store(time.Now().UnixNano())
				}
			}
		}()
	}
	interval := time.Second / time.Duration(cfg.latRate)
	start := time.Now()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		if ctx.Err() != nil {
			break
		}
		jobs <- int64(i + 1)
	}
	close(jobs)
	wg.Wait()
	produced := time.Since(start)
	if p := prodErr.Load(); p != nil {
		return latResult{}, fmt.Errorf("producer: %w", *p)
	}
	// Let the relay deliver the tail.
	deadline := time.Now().Add(30 * time.Second)
	for sink.n.Load() < int64(total)+1 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	// The progress row is updated after every page; while a long
	// transaction holds back the xmin horizon its old versions cannot be
	// pruned, so the table's size shows what the relay leaves behind.
	var progressBytes int64
	_ = b.pool.QueryRow(ctx, `SELECT pg_relation_size($1::regclass)`, s+".progress").Scan(&progressBytes)
	stopRelay()
	<-relayErr

	from := start.Add(cfg.latWarmup).UnixNano()
	window := max(cfg.latDuration/6, time.Second)
	var all []time.Duration
	byWindow := map[int][]time.Duration{}
	missing := 0
	for id := range capacity {
		c := commits[id].Load()
		if c == 0 || c < from {
			continue
		}
		rcv := sink.recv[id].Load()
		if rcv == 0 {
			missing++
			continue
		}
		// A page can reach the sink before the producer's COMMIT returns
		// to it; that counts as zero latency.
		l := max(time.Duration(rcv-c), 0)
		all = append(all, l)
		w := int(time.Duration(c-from) / window)
		byWindow[w] = append(byWindow[w], l)
	}
	if missing > 0 {
		return latResult{}, fmt.Errorf("%d committed events never reached the sink", missing)
	}
	if len(all) == 0 {
		return latResult{}, fmt.Errorf("no events measured")
	}
	res := latResult{n: len(all), open: produced, achieved: float64(total) / produced.Seconds(), progressBytes: progressBytes}
	slices.Sort(all)
	res.p50, res.p99, res.p999, res.max = pct(all, 0.50), pct(all, 0.99), pct(all, 0.999), all[len(all)-1]
	for w := 0; ; w++ {
		l, ok := byWindow[w]
		if !ok {
			break
		}
		slices.Sort(l)
		res.windows = append(res.windows, fmt.Sprintf("%ds:%s", int((time.Duration(w)*window).Seconds()), ms(pct(l, 0.99))))
	}
	b.dropSchema(ctx, s)
	return res, nil
}

func pct(sorted []time.Duration, p float64) time.Duration {
	i := int(p * float64(len(sorted)))
	return sorted[min(i, len(sorted)-1)]
}
