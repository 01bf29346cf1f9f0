package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// orderNote pads a business row to about 200 bytes, like an order with a
// free-text field.
const orderNote = "deliver to the side entrance; call ahead; fragile items in the second box, invoice by e-mail to the accounts address"

// writersScenario measures what the outbox costs the application's writers:
// business transactions of one row INSERT each, plain against the same plus
// one event appended the way README recommends for Go (Outbox.Append in the
// same transaction), and for comparison Outbox.Queue (no round trip of its
// own) and zero-code capture (a row trigger), in alternating phases of
// equal length. No relay runs: the cost is the writers' own.
func (b *bench) writersScenario(ctx context.Context) error {
	cfg := b.cfg
	s, err := b.newSchema(ctx)
	if err != nil {
		return err
	}
	id, _ := schema.Ident(s)
	index := b.newIndexName()
	ob, err := outbox.NewOutbox(s)
	if err != nil {
		return err
	}
	for _, t := range []string{"orders", "orders_captured"} {
		if _, err := b.pool.Exec(ctx, `CREATE TABLE `+id+`.`+t+` (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			customer_id bigint NOT NULL,
			status text NOT NULL,
			amount numeric(12,2) NOT NULL,
			currency text NOT NULL,
			note text NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now(),
			updated_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
	}
	if _, err := b.pool.Exec(ctx, `SELECT `+id+`.capture($1::regclass, $2, 'id')`, s+".orders_captured", index); err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	insert := func(table string) string {
		return `INSERT INTO ` + id + `.` + table + ` (customer_id, status, amount, currency, note) VALUES ($1, 'placed', $2, 'EUR', $3) RETURNING id`
	}
	plainSQL, capturedSQL := insert("orders"), insert("orders_captured")

	type variant struct {
		name string
		tx   func(ctx context.Context, tx pgx.Tx, g int64) error
		n    int64
		took time.Duration
	}
	variants := []*variant{
		{name: "plain", tx: func(ctx context.Context, tx pgx.Tx, g int64) error {
			var oid int64
			return tx.QueryRow(ctx, plainSQL, g%10007, g%100000, orderNote).Scan(&oid)
		}},
		{name: "with Outbox.Append", tx: func(ctx context.Context, tx pgx.Tx, g int64) error {
			var oid int64
			if err := tx.QueryRow(ctx, plainSQL, g%10007, g%100000, orderNote).Scan(&oid); err != nil {
				return err
			}
			_, err := ob.Append(ctx, tx, outbox.Event{IndexName: index, SourceID: strconv.FormatInt(oid, 10), Version: 1,
				Op: outbox.OpUpsert, Document: orderDoc(oid, g)})
			return err
		}},
		{name: "with Outbox.Queue", tx: func(ctx context.Context, tx pgx.Tx, g int64) error {
			// The row and the event in one round trip; the event's id
			// is the application's own, as it must be when the row's id
			// is not known before the batch.
			batch := &pgx.Batch{}
			batch.Queue(plainSQL, g%10007, g%100000, orderNote)
			if err := ob.Queue(batch, outbox.Event{IndexName: index, SourceID: "g" + strconv.FormatInt(g, 10), Version: 1,
				Op: outbox.OpUpsert, Document: orderDoc(g, g)}); err != nil {
				return err
			}
			return tx.SendBatch(ctx, batch).Close()
		}},
		{name: "with capture trigger", tx: func(ctx context.Context, tx pgx.Tx, g int64) error {
			var oid int64
			return tx.QueryRow(ctx, capturedSQL, g%10007, g%100000, orderNote).Scan(&oid)
		}},
	}
	b.rep.line("%d connections, one INSERT per transaction (about 200-byte rows, bigint identity PK); phases of %s, %d rounds of %d variants",
		cfg.writersConns, cfg.writersPhase, cfg.writersRounds, len(variants))
	var seq atomic.Int64 // event numbers, unique across phases
	var rounds []string
	for round := range cfg.writersRounds {
		var parts []string
		for _, v := range variants {
			n, took, err := b.writePhase(ctx, cfg.writersConns, cfg.writersPhase, &seq, v.tx)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			v.n += n
			v.took += took
			parts = append(parts, fmt.Sprintf("%s %.0f/s", v.name, float64(n)/took.Seconds()))
		}
		rounds = append(rounds, fmt.Sprintf("round %d: %s", round+1, strings.Join(parts, ", ")))
	}
	for _, r := range rounds {
		b.rep.line("%s", r)
	}
	tps := func(v *variant) float64 { return float64(v.n) / v.took.Seconds() }
	plain, appended, queued, captured := tps(variants[0]), tps(variants[1]), tps(variants[2]), tps(variants[3])
	b.rep.key("writers: plain %.0f tx/s; with Outbox.Append %.0f tx/s (%.2fx); with Outbox.Queue %.0f tx/s (%.2fx); with the capture trigger %.0f tx/s (%.2fx) (load avg %s)",
		plain, appended, appended/plain, queued, queued/plain, captured, captured/plain, loadAvg())
	b.rep.goal(appended/plain >= 0.85, "writers with Outbox.Append >= 0.85x plain: %.2fx", appended/plain)
	return nil
}

// writePhase runs conns writers for d, each committing fn in transactions
// back to back with the next number of seq, and returns how many committed.
func (b *bench) writePhase(ctx context.Context, conns int, d time.Duration, seq *atomic.Int64, fn func(context.Context, pgx.Tx, int64) error) (int64, time.Duration, error) {
	var n atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				g := seq.Add(1)
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return fn(ctx, tx, g) })
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		return 0, 0, *p
	}
	return n.Load(), time.Since(start), ctx.Err()
}

// orderDoc is the business row as the event's document.
func orderDoc(id, g int64) []byte {
	return []byte(`{"id": ` + strconv.FormatInt(id, 10) + `, "customer_id": ` + strconv.FormatInt(g%10007, 10) +
		`, "status": "placed", "amount": ` + strconv.FormatInt(g%100000, 10) + `, "currency": "EUR", "note": "` + orderNote + `"}`)
}
