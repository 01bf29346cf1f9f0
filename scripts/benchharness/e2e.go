package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// e2eScenario: outbox -> relay -> indexer.Sink (versioned bulk upserts)
// against a raw _bulk loader pushing the same documents, unversioned, with
// the same bulk size and concurrency, into an index with the same settings
// (the ceiling); a hand-written loader reading the same outbox rows from
// PostgreSQL and bulk-indexing them alike (what the relay replaces); and a
// naive sink, one index request per event (the floor).
func (b *bench) e2eScenario(ctx context.Context) error {
	cfg := b.cfg
	if b.es == nil {
		return fmt.Errorf("ELASTICSEARCH_URL: not set")
	}
	n := cfg.e2eN

	// An untimed raw load first: the first load after Elasticsearch
	// started, or after a pause, ran at half the rate of the next (its JIT
	// and caches warming up), and it would otherwise be the relay's.
	warm := b.newIndexName()
	if err := indexer.Bootstrap(ctx, b.es, warm, nil); err != nil {
		return err
	}
	warmTook, err := rawLoad(ctx, b.es, indexer.FirstIndex(warm), min(n, 100_000), cfg.bulkDocs, cfg.bulkWorkers)
	if err != nil {
		return err
	}
	b.rep.line("warm-up (not part of any ratio): raw _bulk loader, %d docs in %.2fs", min(n, 100_000), warmTook.Seconds())
	b.deleteIndices(ctx, warm)

	// Rounds of the three loads, one after the other, so that each ratio
	// compares neighbours in time; the medians are the verdict.
	var ratios, handRatios []float64
	var rawTook time.Duration
	var rel time.Duration
	for round := 1; round <= cfg.e2eRounds; round++ {
		r, hand, raw, err := b.e2eRound(ctx, n, round)
		if err != nil {
			return err
		}
		rel, rawTook = r, raw
		ratios = append(ratios, raw.Seconds()/r.Seconds())
		handRatios = append(handRatios, hand.Seconds()/r.Seconds())
	}

	// The raw loader again, with the sink's versioned actions through the
	// alias: it splits the gap into Elasticsearch's cost of external
	// versioning and the cost of the relay pipeline.
	rawv := b.newIndexName()
	if err := indexer.Bootstrap(ctx, b.es, rawv, nil); err != nil {
		return err
	}
	rawvTook, err := rawLoadVersioned(ctx, b.es, rawv, n, cfg.bulkDocs, cfg.bulkWorkers)
	if err != nil {
		return err
	}
	if err := b.checkCount(ctx, rawv, n); err != nil {
		return err
	}
	b.rep.key("e2e: raw _bulk loader, versioned like the sink (external_gte, require_alias): %d docs in %.2fs = %s (load avg %s)",
		n, rawvTook.Seconds(), rate(float64(n)/rawvTook.Seconds()), loadAvg())
	b.deleteIndices(ctx, rawv)

	// The naive sink.
	nn := min(cfg.e2eNaiveN, n)
	naive := b.newIndexName()
	s2, err := b.newSchema(ctx)
	if err != nil {
		return err
	}
	if _, err := loadBacklog(ctx, b.pool, s2, naive, 1, int64(nn), cfg.loadTx, cfg.loadWorkers); err != nil {
		return err
	}
	if err := indexer.Bootstrap(ctx, b.es, naive, nil); err != nil {
		return err
	}
	naiveTook, err := b.drainInto(ctx, s2, &naiveSink{es: b.es}, nn, cfg.e2ePageDocs)
	if err != nil {
		return err
	}
	if err := b.checkCount(ctx, indexer.ReadAlias(naive), nn); err != nil {
		return err
	}
	b.rep.key("e2e: naive sink (one versioned index request per event) through the relay: %d docs in %.2fs = %s",
		nn, naiveTook.Seconds(), rate(float64(nn)/naiveTook.Seconds()))
	b.deleteIndices(ctx, naive)
	b.dropSchema(ctx, s2)

	ratio, handRatio := median(ratios), median(handRatios)
	b.rep.key("e2e: ratio relay/raw = %s; relay/hand-written loader = %s (over %d rounds); last round: relay/raw-versioned = %.2f; raw-versioned/raw = %.2f; relay/naive = %.1fx",
		spread(ratios, "%.2f"), spread(handRatios, "%.2f"), cfg.e2eRounds, rawvTook.Seconds()/rel.Seconds(), rawTook.Seconds()/rawvTook.Seconds(), (float64(n)/rel.Seconds())/(float64(nn)/naiveTook.Seconds()))
	b.rep.goal(ratio >= 0.9, "end-to-end docs/s >= 0.9x raw prebuilt _bulk (median of %d rounds): %.2f", cfg.e2eRounds, ratio)
	b.rep.goal(handRatio >= 1, "end-to-end docs/s >= 1.0x the hand-written loader (median of %d rounds): %.2f", cfg.e2eRounds, handRatio)
	return nil
}

// appliedCounter passes events to a sink and closes done once expect
// events have a terminal outcome.
type appliedCounter struct {
	inner  relay.Sink
	n      atomic.Int64
	stale  atomic.Int64
	expect int64
	done   chan struct{}
}

func (c *appliedCounter) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	out, err := c.inner.Write(ctx, events)
	if err != nil {
		return out, err
	}
	var k int64
	for _, o := range out {
		switch o.Status {
		case outbox.Applied:
			k++
		case outbox.Stale:
			c.stale.Add(1)
			k++
		case outbox.Rejected:
			k++
		}
	}
	if n := c.n.Add(k); n >= c.expect && n-k < c.expect {
		close(c.done)
	}
	return out, nil
}

// drainInto runs a relay in this process into sink until n events are
// handled and returns the time it took.
func (b *bench) drainInto(ctx context.Context, schemaName string, sink relay.Sink, n, pageDocs int) (time.Duration, error) {
	c := &appliedCounter{inner: sink, expect: int64(n), done: make(chan struct{})}
	r, err := relay.New(relay.Config{Pool: b.pool, Schema: schemaName, Sink: c, MaxBatchDocs: pageDocs,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- r.Run(rctx) }()
	select {
	case <-c.done:
	case err := <-errc:
		return 0, fmt.Errorf("relay stopped after %d of %d events: %v", c.n.Load(), n, err)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	took := time.Since(start)
	cancel()
	<-errc
	if st := c.stale.Load(); st > 0 {
		return 0, fmt.Errorf("%d events reported stale in a first delivery", st)
	}
	return took, nil
}

// rawLoad is the ceiling: the same documents straight into index, plain
// index actions, bulk requests of bulkDocs, workers in flight.
func rawLoad(ctx context.Context, es *elasticsearch.Client, index string, n, bulkDocs, workers int) (time.Duration, error) {
	return rawLoader(ctx, es, index, n, bulkDocs, workers, false, nil)
}

// rawLoadVersioned sends the actions the sink sends: through the write
// alias, version 1, external_gte.
func rawLoadVersioned(ctx context.Context, es *elasticsearch.Client, alias string, n, bulkDocs, workers int) (time.Duration, error) {
	return rawLoader(ctx, es, alias, n, bulkDocs, workers, true, nil)
}

// rawLoader sends items 1..n; item appends the action and source lines of
// one (without the final newline), nil for the e2e scenario's events.
func rawLoader(ctx context.Context, es *elasticsearch.Client, index string, n, bulkDocs, workers int, versioned bool,
	item func(b []byte, g int64) []byte) (time.Duration, error) {
	if item == nil {
		item = func(b []byte, g int64) []byte { return appendEvent(b, g, versioned) }
	}
	chunks := make(chan int64)
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var body []byte
			for lo := range chunks {
				body = body[:0]
				for g := lo; g < min(lo+int64(bulkDocs), int64(n)+1); g++ {
					body = append(item(body, g), '\n')
				}
				if err := rawBulk(ctx, es, index, body, versioned); err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	for lo := int64(1); lo <= int64(n); lo += int64(bulkDocs) {
		chunks <- lo
	}
	close(chunks)
	wg.Wait()
	if p := failed.Load(); p != nil {
		return 0, *p
	}
	return time.Since(start), nil
}

func appendEvent(b []byte, g int64, versioned bool) []byte {
	b = append(b, `{"index":{"_id":"doc-`...)
	b = strconv.AppendInt(b, g, 10)
	if versioned {
		b = append(b, `","version":1,"version_type":"external_gte`...)
	}
	b = append(b, "\"}}\n"...)
	return append(b, rawDoc(g)...)
}

func rawBulk(ctx context.Context, es *elasticsearch.Client, index string, body []byte, versioned bool) error {
	req := esapi.BulkRequest{Index: index, Body: bytes.NewReader(body), FilterPath: []string{"errors", "items.*.status"}}
	if versioned {
		yes := true
		req.RequireAlias = &yes
	}
	res, err := req.Do(ctx, es)
	if err != nil {
		return fmt.Errorf("raw bulk: %w", err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	if res.IsError() || !bytes.HasPrefix(out, []byte(`{"errors":false`)) {
		return fmt.Errorf("raw bulk: %s: %.300s", res.Status(), out)
	}
	return nil
}

// naiveSink indexes one event per request, versioned like the real sink.
type naiveSink struct{ es *elasticsearch.Client }

func (s *naiveSink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	out := make([]outbox.Outcome, len(events))
	yes := true
	for i, e := range events {
		v := int(e.Version)
		res, err := esapi.IndexRequest{Index: e.IndexName, DocumentID: e.SourceID, Body: bytes.NewReader(e.Document),
			Version: &v, VersionType: "external_gte", RequireAlias: &yes}.Do(ctx, s.es)
		if err != nil {
			out[i] = outbox.Outcome{Status: outbox.Retry, Reason: err.Error()}
			continue
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		switch {
		case res.StatusCode == 200 || res.StatusCode == 201:
			out[i] = outbox.Outcome{Status: outbox.Applied}
		case res.StatusCode == 409:
			out[i] = outbox.Outcome{Status: outbox.Stale}
		default:
			out[i] = outbox.Outcome{Status: outbox.Retry, Reason: res.Status()}
		}
	}
	return out, nil
}

// checkCount refreshes target and checks it holds exactly want documents.
func (b *bench) checkCount(ctx context.Context, target string, want int) error {
	res, err := b.es.Indices.Refresh(b.es.Indices.Refresh.WithContext(ctx), b.es.Indices.Refresh.WithIndex(target))
	if err != nil {
		return err
	}
	res.Body.Close()
	res, err = b.es.Count(b.es.Count.WithContext(ctx), b.es.Count.WithIndex(target))
	if err != nil {
		return err
	}
	defer res.Body.Close()
	var c struct {
		Count int `json:"count"`
	}
	if err := json.NewDecoder(res.Body).Decode(&c); err != nil {
		return fmt.Errorf("count %s: %w", target, err)
	}
	if c.Count != want {
		return fmt.Errorf("count %s: %d documents, want %d", target, c.Count, want)
	}
	return nil
}

// selfCPU is this process's user+system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// e2eRound loads n events and measures the relay into the real sink, the
// hand-written loader on the same rows and the raw loader. The order
// turns with the round (relay, hand-written, raw; then hand-written, raw,
// relay; ...), so that over three rounds each load runs once in each
// place: right after the backlog's load and checkpoint (the first reader
// of the rows also sets their hint bits), or right after another load's
// index was deleted. With the relay always first, its rate fell from
// round to round (111k, 95k, 91k docs/s at 1M) while the loaders' held.
func (b *bench) e2eRound(ctx context.Context, n, round int) (rel, hand, raw time.Duration, err error) {
	cfg := b.cfg
	label := ""
	if cfg.e2eRounds > 1 {
		label = fmt.Sprintf(" [round %d of %d]", round, cfg.e2eRounds)
	}
	name := b.newIndexName()
	s, err := b.newSchema(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	defer b.dropSchema(ctx, s)
	if _, err := loadBacklog(ctx, b.pool, s, name, 1, int64(n), cfg.loadTx, cfg.loadWorkers); err != nil {
		return 0, 0, 0, err
	}

	relayStep := func() error {
		// Created before the clock starts, as the loaders' indexes are;
		// the sink would otherwise create it within the relay's time.
		if err := indexer.Bootstrap(ctx, b.es, name, nil); err != nil {
			return err
		}
		sink, err := indexer.NewSink(indexer.Options{Client: b.es, MaxBatchDocs: cfg.bulkDocs, Workers: cfg.bulkWorkers, JSONB: true})
		if err != nil {
			return err
		}
		stopProfile := func() {}
		if cfg.profileDir != "" {
			f, err := os.Create(filepath.Join(cfg.profileDir, fmt.Sprintf("e2e-%d-%d.pprof", n, round)))
			if err != nil {
				return err
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				f.Close()
				return err
			}
			stopProfile = func() { pprof.StopCPUProfile(); f.Close() }
		}
		cpu0 := selfCPU()
		took, err := b.drainInto(ctx, s, sink, n, cfg.e2ePageDocs)
		stopProfile()
		if err != nil {
			return err
		}
		b.rep.line("relay + sink CPU in this process: %.1f µs/doc", float64(selfCPU()-cpu0)/1e3/float64(n))
		if err := b.checkCount(ctx, indexer.ReadAlias(name), n); err != nil {
			return err
		}
		rel = took
		b.rep.key("e2e%s: outbox -> relay -> Elasticsearch (versioned, page %d, bulk %d x %d in flight): %d docs in %.2fs = %s (load avg %s)",
			label, cfg.e2ePageDocs, cfg.bulkDocs, cfg.bulkWorkers, n, took.Seconds(), rate(float64(n)/took.Seconds()), loadAvg())
		b.deleteIndices(ctx, name)
		return nil
	}

	// loaderStep measures a baseline loader into a fresh index of its own,
	// bootstrapped before the clock starts, and sets *took.
	loaderStep := func(what string, load func(index string) (time.Duration, error), took *time.Duration) func() error {
		return func() error {
			index := b.newIndexName()
			if err := indexer.Bootstrap(ctx, b.es, index, nil); err != nil {
				return err
			}
			d, err := load(indexer.FirstIndex(index))
			if err != nil {
				return err
			}
			if err := b.checkCount(ctx, index, n); err != nil {
				return err
			}
			*took = d
			b.rep.key("e2e%s: %s: %d docs in %.2fs = %s (load avg %s)", label, what, n, d.Seconds(), rate(float64(n)/d.Seconds()), loadAvg())
			b.deleteIndices(ctx, index)
			return nil
		}
	}
	handStep := loaderStep(fmt.Sprintf("hand-written loader (pgx keyset pages of %d from the outbox table, unversioned index actions, bulk %d x %d in flight)",
		cfg.e2ePageDocs, cfg.bulkDocs, cfg.bulkWorkers), func(index string) (time.Duration, error) {
		d, err := handLoad(ctx, b.pool, b.es, s, index, n, cfg.e2ePageDocs, cfg.bulkDocs, cfg.bulkWorkers)
		if err != nil {
			return 0, fmt.Errorf("hand-written loader: %w", err)
		}
		return d, nil
	}, &hand)
	rawStep := loaderStep(fmt.Sprintf("raw _bulk loader (unversioned index actions, bulk %d x %d in flight)", cfg.bulkDocs, cfg.bulkWorkers),
		func(index string) (time.Duration, error) {
			return rawLoad(ctx, b.es, index, n, cfg.bulkDocs, cfg.bulkWorkers)
		}, &raw)

	steps := []func() error{relayStep, handStep, rawStep}
	for i := range steps {
		if err := steps[(i+round-1)%len(steps)](); err != nil {
			return 0, 0, 0, err
		}
	}
	return rel, hand, raw, nil
}
