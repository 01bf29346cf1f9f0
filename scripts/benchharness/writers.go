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
// same transaction), with an explicit version and with an automatic one,
// and Outbox.Queue (no round trip of its own) and zero-code capture (a row
// trigger), in alternating phases of equal length. The baseline for the
// outbox is what a team would write by hand in its place: one INSERT into a
// minimal outbox table (bigserial key, text aggregate id, jsonb,
// timestamptz default now()), as its own statement for Append and in the
// same batch for Queue. No relay runs: the cost is the writers' own.
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
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+id+`.minimal_outbox (
		id bigserial PRIMARY KEY,
		aggregate_id text NOT NULL,
		payload jsonb NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, `SELECT `+id+`.capture($1::regclass, $2, 'id')`, s+".orders_captured", index); err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	insert := func(table string) string {
		return `INSERT INTO ` + id + `.` + table + ` (customer_id, status, amount, currency, note) VALUES ($1, 'placed', $2, 'EUR', $3) RETURNING id`
	}
	plainSQL, capturedSQL := insert("orders"), insert("orders_captured")
	minimalSQL := `INSERT INTO ` + id + `.minimal_outbox (aggregate_id, payload) VALUES ($1, $2)`

	type variant struct {
		name string
		tx   func(ctx context.Context, tx pgx.Tx, g int64) error
		tps  []float64 // per round
		cpu  []float64 // server CPU µs per transaction, per round
	}
	withRow := func(event func(ctx context.Context, tx pgx.Tx, oid, g int64) error) func(context.Context, pgx.Tx, int64) error {
		return func(ctx context.Context, tx pgx.Tx, g int64) error {
			var oid int64
			if err := tx.QueryRow(ctx, plainSQL, g%10007, g%100000, orderNote).Scan(&oid); err != nil {
				return err
			}
			return event(ctx, tx, oid, g)
		}
	}
	appendEvent := func(version int64) func(context.Context, pgx.Tx, int64, int64) error {
		return func(ctx context.Context, tx pgx.Tx, oid, g int64) error {
			_, err := ob.Append(ctx, tx, outbox.Event{IndexName: index, SourceID: strconv.FormatInt(oid, 10), Version: version,
				Op: outbox.OpUpsert, Document: orderDoc(oid, g)})
			return err
		}
	}
	// The batched variants send the row and the event in one round trip;
	// the event's id is the application's own, as it must be when the
	// row's id is not known before the batch.
	queueEvent := func(version int64) func(context.Context, pgx.Tx, int64) error {
		return func(ctx context.Context, tx pgx.Tx, g int64) error {
			batch := &pgx.Batch{}
			batch.Queue(plainSQL, g%10007, g%100000, orderNote)
			if err := ob.Queue(batch, outbox.Event{IndexName: index, SourceID: "g" + strconv.FormatInt(g, 10), Version: version,
				Op: outbox.OpUpsert, Document: orderDoc(g, g)}); err != nil {
				return err
			}
			return tx.SendBatch(ctx, batch).Close()
		}
	}
	variants := []*variant{
		{name: "plain", tx: func(ctx context.Context, tx pgx.Tx, g int64) error {
			var oid int64
			return tx.QueryRow(ctx, plainSQL, g%10007, g%100000, orderNote).Scan(&oid)
		}},
		{name: "with a hand-written INSERT", tx: withRow(func(ctx context.Context, tx pgx.Tx, oid, g int64) error {
			_, err := tx.Exec(ctx, minimalSQL, strconv.FormatInt(oid, 10), orderDoc(oid, g))
			return err
		})},
		{name: "with Outbox.Append", tx: withRow(appendEvent(1))},
		{name: "with Outbox.Append, auto version", tx: withRow(appendEvent(0))},
		{name: "with a hand-written INSERT, batched", tx: func(ctx context.Context, tx pgx.Tx, g int64) error {
			batch := &pgx.Batch{}
			batch.Queue(plainSQL, g%10007, g%100000, orderNote)
			batch.Queue(minimalSQL, "g"+strconv.FormatInt(g, 10), orderDoc(g, g))
			return tx.SendBatch(ctx, batch).Close()
		}},
		{name: "with Outbox.Queue", tx: queueEvent(1)},
		{name: "with Outbox.Queue, auto version", tx: queueEvent(0)},
		{name: "with capture trigger", tx: func(ctx context.Context, tx pgx.Tx, g int64) error {
			var oid int64
			return tx.QueryRow(ctx, capturedSQL, g%10007, g%100000, orderNote).Scan(&oid)
		}},
	}
	const plain, hand, appended, appendedAuto, handBatched, queued, queuedAuto, captured = 0, 1, 2, 3, 4, 5, 6, 7
	b.rep.line("%d connections, one INSERT per transaction (about 200-byte rows, bigint identity PK); phases of %s, %d rounds of %d variants",
		cfg.writersConns, cfg.writersPhase, cfg.writersRounds, len(variants))
	var seq atomic.Int64 // event numbers, unique across phases
	for round := range cfg.writersRounds {
		var parts []string
		for _, v := range variants {
			before := b.harnessBackendCPU(ctx)
			n, took, err := b.writePhase(ctx, cfg.writersConns, cfg.writersPhase, &seq, v.tx)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			v.tps = append(v.tps, float64(n)/took.Seconds())
			part := fmt.Sprintf("%s %.0f/s", v.name, v.tps[round])
			if used, ok := cpuSince(before, b.harnessBackendCPU(ctx)); ok && n > 0 {
				v.cpu = append(v.cpu, float64(used.Microseconds())/float64(n))
				part += fmt.Sprintf(" %.0f µs", v.cpu[round])
			}
			parts = append(parts, part)
		}
		b.rep.line("round %d: %s (load avg %s)", round+1, strings.Join(parts, ", "), loadAvg())
	}
	// Ratios are taken within a round, between neighbouring phases.
	ratio := func(i, j int) []float64 {
		var out []float64
		for r := range variants[i].tps {
			out = append(out, variants[i].tps[r]/variants[j].tps[r])
		}
		return out
	}
	b.rep.key("writers: plain %s tx/s; with a hand-written outbox INSERT %s tx/s (%sx plain); batched %s tx/s (load avg %s)",
		spread(variants[plain].tps, "%.0f"), spread(variants[hand].tps, "%.0f"), spread(ratio(hand, plain), "%.2f"),
		spread(variants[handBatched].tps, "%.0f"), loadAvg())
	for _, c := range []struct{ i, base int }{{appended, hand}, {appendedAuto, hand}, {queued, handBatched}, {queuedAuto, handBatched}, {captured, hand}} {
		b.rep.key("writers %s: %s tx/s; %sx plain; %sx the hand-written INSERT%s", variants[c.i].name, spread(variants[c.i].tps, "%.0f"),
			spread(ratio(c.i, plain), "%.2f"), spread(ratio(c.i, c.base), "%.2f"), map[bool]string{true: ", batched", false: ""}[c.base == handBatched])
	}
	if len(variants[plain].cpu) == cfg.writersRounds {
		var parts []string
		for _, v := range variants {
			if len(v.cpu) != cfg.writersRounds {
				continue
			}
			d := make([]float64, len(v.cpu))
			for r := range v.cpu {
				d[r] = v.cpu[r] - variants[plain].cpu[r]
			}
			parts = append(parts, fmt.Sprintf("%s %s µs (+%s)", v.name, spread(v.cpu, "%.0f"), spread(d, "%.0f")))
		}
		b.rep.key("writers server CPU per transaction (the harness's backends, /proc schedstat): %s", strings.Join(parts, "; "))
	}
	b.rep.goal(median(ratio(appended, plain)) >= 0.85, "writers with Outbox.Append >= 0.85x plain: %.2fx", median(ratio(appended, plain)))
	for _, c := range []struct{ i, base int }{{appended, hand}, {appendedAuto, hand}, {queued, handBatched}, {queuedAuto, handBatched}} {
		r := median(ratio(c.i, c.base))
		b.rep.goal(r >= 1.0, "writers %s >= 1.0x %s: %.2fx", variants[c.i].name, variants[c.base].name, r)
	}
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

// harnessBackendCPU is the time on CPU of each of the harness pool's
// backends (application_name benchharness), or nil when the server's
// processes are not readable here.
func (b *bench) harnessBackendCPU(ctx context.Context) map[int]time.Duration {
	rows, err := b.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'benchharness'`)
	if err != nil {
		return nil
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil
	}
	out := map[int]time.Duration{}
	for _, p := range pids {
		c, ok := schedCPU([]int{p})
		if !ok {
			return nil
		}
		out[p] = c
	}
	return out
}

// cpuSince adds up what each backend used between two readings; one that
// appeared in between counts from its start.
func cpuSince(before, after map[int]time.Duration) (time.Duration, bool) {
	if before == nil || after == nil {
		return 0, false
	}
	var sum time.Duration
	for p, c := range after {
		sum += c - before[p]
	}
	return sum, true
}

// orderDoc is the business row as the event's document.
func orderDoc(id, g int64) []byte {
	return []byte(`{"id": ` + strconv.FormatInt(id, 10) + `, "customer_id": ` + strconv.FormatInt(g%10007, 10) +
		`, "status": "placed", "amount": ` + strconv.FormatInt(g%100000, 10) + `, "currency": "EUR", "note": "` + orderNote + `"}`)
}
