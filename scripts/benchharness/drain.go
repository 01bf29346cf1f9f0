package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

const queueColumns = `id, xid, index_name, source_id, version, op, document, coalesce(event_type, ''), headers, occurred_at, created_at`

func scanEvent(row pgx.Row) (outbox.Event, error) {
	var e outbox.Event
	var op string
	err := row.Scan(&e.ID, &e.XID, &e.IndexName, &e.SourceID, &e.Version, &op, &e.Document, &e.EventType, &e.Headers, &e.OccurredAt, &e.CreatedAt)
	e.Op = outbox.Op(op)
	return e, err
}

// drainScenario: the relay drains an N-event backlog into a no-op sink;
// in the same run a naive relay (claim one event FOR UPDATE SKIP LOCKED,
// deliver, delete, commit) and a claim-and-DELETE batch loop drain copies
// of the same events.
func (b *bench) drainScenario(ctx context.Context) error {
	cfg := b.cfg
	s, err := b.newSchema(ctx)
	if err != nil {
		return err
	}
	loadTook, err := loadBacklog(ctx, b.pool, s, "bench", 1, int64(cfg.drainN), cfg.loadTx, cfg.loadWorkers)
	if err != nil {
		return err
	}
	b.rep.line("backlog: %d events (~100-byte documents) loaded in %s (%s, %d per transaction, %d connections)",
		cfg.drainN, loadTook.Round(time.Millisecond), rate(float64(cfg.drainN)/loadTook.Seconds()), cfg.loadTx, cfg.loadWorkers)
	naiveN, peerN := min(cfg.naiveN, cfg.drainN), min(cfg.peerN, cfg.drainN)
	if err := copyQueue(ctx, b.pool, s, "naive", naiveN); err != nil {
		return err
	}
	if peerN > 0 {
		if err := copyQueue(ctx, b.pool, s, "peer", peerN); err != nil {
			return err
		}
	}

	profile := ""
	if cfg.profileDir != "" {
		profile = filepath.Join(cfg.profileDir, fmt.Sprintf("drain-%d.pprof", cfg.drainN))
	}
	res, err := b.runChild(ctx, s, cfg.drainN, cfg.pageDocs, profile)
	if err != nil {
		return err
	}
	b.rep.key("drain: relay %d events in %.2fs = %s (no-op sink, page %d, child VmHWM %s, child CPU %.2fs = %.1f µs/event, load avg %s)",
		res.Events, res.Seconds, rate(res.Rate), cfg.pageDocs, mb(res.VmHWMKB), res.CPU, res.CPU*1e6/float64(res.Events), loadAvg())
	if profile != "" {
		b.rep.line("CPU profile of the relay child: %s (go tool pprof -top %s %s)", profile, b.self, profile)
	}

	naive, got, err := naiveDrain(ctx, b.pool, s, naiveN, cfg.naiveTime)
	if err != nil {
		return err
	}
	b.rep.key("drain: naive relay (1 event per transaction, FOR UPDATE SKIP LOCKED LIMIT 1 + DELETE) %d events = %s",
		got, rate(naive))
	var peer float64
	if peerN > 0 {
		if peer, err = peerDrain(ctx, b.pool, s, peerN, 1000); err != nil {
			return err
		}
		b.rep.key("drain: claim-and-DELETE batch loop (DELETE ... LIMIT 1000 FOR UPDATE SKIP LOCKED RETURNING) %d events = %s",
			peerN, rate(peer))
	}
	b.rep.key("drain: ratio relay/naive = %.1fx", res.Rate/naive)
	if peer > 0 {
		b.rep.key("drain: ratio relay/claim-and-DELETE = %.2fx", res.Rate/peer)
	}
	b.rep.goal(res.Rate >= 200_000, "drain rate >= 200k events/s: %s at N=%d", rate(res.Rate), cfg.drainN)
	return nil
}

// naiveDrain is the baseline relay: one event per transaction.
// It stops after limit: at a few hundred events per second a full copy
// of the backlog would take the whole run.
func naiveDrain(ctx context.Context, pool *pgxpool.Pool, schemaName string, n int, limit time.Duration) (float64, int64, error) {
	id, _ := schema.Ident(schemaName)
	claim := `SELECT ` + queueColumns + ` FROM ` + id + `.naive ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`
	del := `DELETE FROM ` + id + `.naive WHERE id = $1`
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	sink := newCountingSink(int64(n))
	start := time.Now()
	for sink.n.Load() < int64(n) && time.Since(start) < limit {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return 0, 0, err
		}
		e, err := scanEvent(tx.QueryRow(ctx, claim))
		if errors.Is(err, pgx.ErrNoRows) {
			_ = tx.Rollback(ctx)
			break
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			return 0, 0, fmt.Errorf("naive claim: %w", err)
		}
		if _, err := sink.Write(ctx, []outbox.Event{e}); err != nil {
			return 0, 0, err
		}
		if _, err := tx.Exec(ctx, del, e.ID); err != nil {
			_ = tx.Rollback(ctx)
			return 0, 0, fmt.Errorf("naive delete: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, 0, fmt.Errorf("naive commit: %w", err)
		}
	}
	got := sink.n.Load()
	if got == 0 {
		return 0, 0, fmt.Errorf("naive relay delivered nothing")
	}
	return float64(got) / time.Since(start).Seconds(), got, nil
}

// peerDrain is the claim-and-DELETE batch loop: each transaction deletes
// the next batch (RETURNING the rows), delivers it and commits.
func peerDrain(ctx context.Context, pool *pgxpool.Pool, schemaName string, n, batch int) (float64, error) {
	id, _ := schema.Ident(schemaName)
	q := fmt.Sprintf(`DELETE FROM %[1]s.peer WHERE id IN (SELECT id FROM %[1]s.peer ORDER BY id LIMIT %[2]d FOR UPDATE SKIP LOCKED)
		RETURNING `+queueColumns, id, batch)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	sink := newCountingSink(int64(n))
	events := make([]outbox.Event, 0, batch)
	start := time.Now()
	for {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return 0, err
		}
		rows, err := tx.Query(ctx, q)
		if err != nil {
			_ = tx.Rollback(ctx)
			return 0, fmt.Errorf("claim-and-delete: %w", err)
		}
		events = events[:0]
		for rows.Next() {
			e, err := scanEvent(rows)
			if err != nil {
				rows.Close()
				_ = tx.Rollback(ctx)
				return 0, err
			}
			events = append(events, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			_ = tx.Rollback(ctx)
			return 0, fmt.Errorf("claim-and-delete: %w", err)
		}
		if len(events) == 0 {
			_ = tx.Rollback(ctx)
			break
		}
		if _, err := sink.Write(ctx, events); err != nil {
			return 0, err
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, err
		}
	}
	if got := sink.n.Load(); got != int64(n) {
		return 0, fmt.Errorf("claim-and-delete delivered %d of %d events", got, n)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
