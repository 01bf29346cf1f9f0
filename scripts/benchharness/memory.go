package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// bigDocSQL is a document of about kb KB in SQL. The body repeats one
// md5, so PostgreSQL's TOAST and Elasticsearch's stored fields compress it
// and a recorded run of a million stays on disk; the relay and the sink
// still hold and send every byte.
func bigDocSQL(kb int) string {
	return `jsonb_build_object('n', g, 'body', repeat(md5(g::text), ` + strconv.Itoa(kb*32) + `))`
}

// bigDoc is the Go producer's document of about kb KB.
func bigDoc(g int64, kb int) []byte {
	h := fmt.Sprintf("%032x", g)
	return []byte(`{"n": ` + strconv.FormatInt(g, 10) + `, "body": "` + strings.Repeat(h, kb*32) + `"}`)
}

// memoryScenario measures the peak resident set (VmHWM) of `outboxd relay`
// processes: draining a backlog of large documents, sustaining a stream of
// them, and delivering one very large document.
func (b *bench) memoryScenario(ctx context.Context) error {
	cfg := b.cfg
	proxy, err := b.startESProxy()
	if err != nil {
		return err
	}
	defer proxy.close()

	backlog, err := b.memoryBacklog(ctx, proxy)
	if err != nil {
		return fmt.Errorf("backlog: %w", err)
	}
	sustained, err := b.memorySustained(ctx, proxy)
	if err != nil {
		return fmt.Errorf("sustained: %w", err)
	}
	b.rep.goal(backlog <= 100*1024, "peak RSS draining a backlog of %d x %d KB <= 100 MB: %s", cfg.memN, cfg.memDocKB, mb(backlog))
	b.rep.goal(sustained <= 100*1024, "peak RSS sustaining %d events/s of %d KB <= 100 MB: %s", cfg.memRate, cfg.memDocKB, mb(sustained))
	if cfg.memBigMB > 0 {
		if err := b.memoryBig(ctx, proxy); err != nil {
			return fmt.Errorf("large document: %w", err)
		}
	}
	return nil
}

func (b *bench) memoryBacklog(ctx context.Context, proxy *esProxy) (int64, error) {
	cfg := b.cfg
	s, err := b.newSchema(ctx)
	if err != nil {
		return 0, err
	}
	index := b.newIndexName()
	txSize := max(1, 1024/cfg.memDocKB) // about 1 MB per loading transaction
	took, err := loadDocs(ctx, b.pool, s, index, 1, int64(cfg.memN), txSize, cfg.loadWorkers, true, bigDocSQL(cfg.memDocKB))
	if err != nil {
		return 0, err
	}
	b.rep.line("backlog of %d x %d KB loaded in %s", cfg.memN, cfg.memDocKB, took.Round(time.Millisecond))
	at := newAckTimes(cfg.memN)
	defer at.watch(proxy)()
	start := time.Now()
	p, err := b.startRelay(ctx, s, index, proxy.url)
	if err != nil {
		return 0, err
	}
	defer p.kill()
	if err := at.waitAcked(ctx, int64(cfg.memN), time.Hour, p); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	peak := p.peakRSS()
	if _, err := p.stop(30 * time.Second); err != nil {
		return 0, err
	}
	p50, p99, _, _ := proxy.bulkTimes(start)
	b.rep.key("memory: outboxd relay drained %d x %d KB into Elasticsearch in %.1fs (%s, %.0f MB/s; Elasticsearch's answer to a _bulk p50 %s p99 %s): peak RSS (VmHWM) %s (load avg %s)",
		cfg.memN, cfg.memDocKB, elapsed.Seconds(), rate(float64(cfg.memN)/elapsed.Seconds()),
		float64(cfg.memN)*float64(cfg.memDocKB)/1024/elapsed.Seconds(), ms(p50), ms(p99), mb(peak), loadAvg())
	b.deleteIndices(ctx, index)
	b.dropSchema(ctx, s)
	return peak, nil
}

func (b *bench) memorySustained(ctx context.Context, proxy *esProxy) (int64, error) {
	cfg := b.cfg
	s, err := b.newSchema(ctx)
	if err != nil {
		return 0, err
	}
	index := b.newIndexName()
	ob, err := outbox.NewOutbox(s)
	if err != nil {
		return 0, err
	}
	total := int(float64(cfg.memRate) * cfg.memDuration.Seconds())
	at := newAckTimes(total)
	defer at.watch(proxy)()
	p, err := b.startRelay(ctx, s, index, proxy.url)
	if err != nil {
		return 0, err
	}
	defer p.kill()
	if err := b.appendEvent(ctx, ob, index, 0, bigDoc(0, cfg.memDocKB)); err != nil {
		return 0, err
	}
	if err := at.waitAcked(ctx, 1, time.Minute, p); err != nil {
		return 0, err
	}
	n, took, err := pace(ctx, cfg.memRate, cfg.memDuration, cfg.producers(cfg.memRate), func(g int64) error {
		return b.appendEvent(ctx, ob, index, g, bigDoc(g, cfg.memDocKB))
	})
	if err != nil {
		return 0, err
	}
	if err := at.waitAcked(ctx, int64(n)+1, 5*time.Minute, p); err != nil {
		return 0, err
	}
	peak := p.peakRSS()
	if _, err := p.stop(30 * time.Second); err != nil {
		return 0, err
	}
	b.rep.key("memory: outboxd relay under %d events/s of %d KB for %s (achieved %.0f/s, %d events): peak RSS (VmHWM) %s (load avg %s)",
		cfg.memRate, cfg.memDocKB, cfg.memDuration, float64(n)/took.Seconds(), n, mb(peak), loadAvg())
	b.deleteIndices(ctx, index)
	b.dropSchema(ctx, s)
	return peak, nil
}

// memoryBig appends one document of memory-big-mb MB and waits until
// Elasticsearch has it or the relay has dead-lettered it.
func (b *bench) memoryBig(ctx context.Context, proxy *esProxy) error {
	cfg := b.cfg
	w, err := b.startWarmRelay(ctx, proxy, 1)
	if err != nil {
		return err
	}
	defer w.close()
	s, index, ob, at, p := w.schema, w.index, w.ob, w.at, w.p
	before := p.peakRSS()
	start := time.Now()
	if err := b.appendEvent(ctx, ob, index, 1, bigDoc(1, cfg.memBigMB*1024)); err != nil {
		return err
	}
	id, _ := schema.Ident(s)
	var outcome string
	for {
		if at.ack[1].Load() != 0 && b.checkCount(ctx, indexer.ReadAlias(index), 2) == nil {
			outcome = "delivered"
			break
		}
		var reason string
		err := b.pool.QueryRow(ctx, `SELECT reason FROM `+id+`.dead_letters WHERE source_id = 'doc-1'`).Scan(&reason)
		if err == nil {
			outcome = "dead-lettered: " + reason
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if time.Since(start) > 10*time.Minute {
			return fmt.Errorf("neither delivered nor dead-lettered after 10 minutes: %s", p.log.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.exited:
			return fmt.Errorf("outboxd relay exited: %v: %s", p.err, p.log.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	peak := p.peakRSS()
	if _, err := p.stop(30 * time.Second); err != nil {
		return err
	}
	short := outcome
	if len(short) > 100 {
		b.rep.line("the large document: %s", outcome)
		short = short[:100] + "..."
	}
	b.rep.key("memory: one %d MB document %s after %.1fs: peak RSS (VmHWM) %s (%s before it) (load avg %s)",
		cfg.memBigMB, short, elapsed.Seconds(), mb(peak), mb(before), loadAvg())
	b.rep.goal(outcome == "delivered" || len(outcome) > len("dead-lettered: "),
		"a %d MB document is delivered or dead-lettered with a reason: %s", cfg.memBigMB, short)
	b.deleteIndices(ctx, index)
	b.dropSchema(ctx, s)
	return nil
}
