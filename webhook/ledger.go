package webhook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Delivery states in the ledger.
const (
	StateReserved  = "reserved"  // owned by one message, being delivered
	StateDelivered = "delivered" // the receiver answered 2xx
	StateFailed    = "failed"    // the receiver refused it (4xx), retries ran out, or its check erred
	StateSkipped   = "skipped"   // the eligibility check said no; nothing was sent
	StateUnknown   = "unknown"   // it may or may not have been received: an operator decides
	// A retry is due at next_attempt_at: the message used up its in-line
	// retries (Destination.RetryInline), its event is acknowledged, and
	// the destination's leader sends it from the row (see Sink.Lead).
	StateRetrying = "retrying"
	// No live relay serves the destination (yet): the message waits, and
	// the destination's sink takes it over once a relay serves it.
	StateWaiting = "waiting"
)

// ledger is the delivery ledger of one schema.
type ledger struct {
	pool   *pgxpool.Pool
	schema string // quoted
}

// entry is what a message finds in the ledger when it reserves its key.
type entry struct {
	eventID   int64 // the message holding the reservation
	state     string
	attempts  int
	inFlight  bool
	uncertain bool
	conflict  bool // this message has the key of another with a different payload
	// checkRuns are the runs of the message's check that erred in a row
	// (check_runs): they count towards MaxAttempts, across parks too.
	checkRuns int
}

// reserve inserts the (destination, key) row for message id, or finds the
// row that is already there and records id as a duplicate of it. The
// primary key makes this atomic: of two messages with one key, exactly one
// owns the row. initial is the state of a new row. The owner of a waiting
// row takes it over with any other initial state, its reserved age
// starting then.
func (l *ledger) reserve(ctx context.Context, dest, key string, id int64, payload []byte, initial, reason string) (entry, error) {
	var e entry
	err := l.pool.QueryRow(ctx, `INSERT INTO `+l.schema+`.deliveries AS d
			(destination, dedupe_key, event_id, payload, state, last_error, finished_at)
		VALUES ($1, $2, $3, $4, $5, nullif($6, ''), CASE WHEN $5 IN ('reserved', 'waiting') THEN NULL ELSE now() END)
		ON CONFLICT (destination, dedupe_key) DO UPDATE
		SET duplicates = CASE WHEN d.event_id = EXCLUDED.event_id THEN d.duplicates ELSE d.duplicates || EXCLUDED.event_id END,
		    state = CASE WHEN d.event_id = EXCLUDED.event_id THEN EXCLUDED.state ELSE d.state END,
		    finished_at = CASE WHEN d.event_id = EXCLUDED.event_id THEN EXCLUDED.finished_at ELSE d.finished_at END,
		    reserved_at = CASE WHEN d.event_id = EXCLUDED.event_id THEN now() ELSE d.reserved_at END,
		    last_error = CASE WHEN d.event_id = EXCLUDED.event_id THEN coalesce(EXCLUDED.last_error, d.last_error) ELSE d.last_error END,
		    conflicts = CASE WHEN d.event_id <> EXCLUDED.event_id AND d.payload IS DISTINCT FROM EXCLUDED.payload
		                     THEN d.conflicts || EXCLUDED.event_id ELSE d.conflicts END
		WHERE (d.event_id <> EXCLUDED.event_id AND NOT EXCLUDED.event_id = ANY(d.duplicates))
		   OR (d.event_id = EXCLUDED.event_id AND d.state = 'waiting' AND EXCLUDED.state <> 'waiting')
		RETURNING d.event_id, d.state, d.attempts, d.in_flight, d.uncertain, $3 = ANY(d.conflicts), d.check_runs`,
		dest, key, id, string(payload), initial, reason).Scan(&e.eventID, &e.state, &e.attempts, &e.inFlight, &e.uncertain, &e.conflict, &e.checkRuns)
	if !errors.Is(err, pgx.ErrNoRows) {
		if err != nil {
			return e, fmt.Errorf("webhook: ledger: reserve %s/%s: %w", dest, key, err)
		}
		return e, nil
	}
	// The WHERE above left the row alone (a replay of a known message):
	// nothing is returned, so read it.
	e, err = l.read(ctx, dest, key, id)
	if err != nil {
		return e, fmt.Errorf("webhook: ledger: reserve %s/%s: %w", dest, key, err)
	}
	return e, nil
}

// read returns the row of (dest, key) as message id sees it.
func (l *ledger) read(ctx context.Context, dest, key string, id int64) (entry, error) {
	var e entry
	err := l.pool.QueryRow(ctx, `SELECT event_id, state, attempts, in_flight, uncertain, $3 = ANY(conflicts), check_runs FROM `+l.schema+`.deliveries
		WHERE destination = $1 AND dedupe_key = $2`, dest, key, id).Scan(&e.eventID, &e.state, &e.attempts, &e.inFlight, &e.uncertain, &e.conflict, &e.checkRuns)
	return e, err
}

// claim marks the next attempt as in flight, just before the request is
// sent, if the row is still as this relay last saw it (its state included:
// reserved for a message of a page, retrying for a parked one). Losing the
// claim means another relay took the message over (after a failover) or
// an operator settled it. A claim follows a check that passed (or no
// check): the runs of it that erred start again from 0.
func (l *ledger) claim(ctx context.Context, dest, key string, id int64, seen entry) (bool, error) {
	tag, err := l.pool.Exec(ctx, `UPDATE `+l.schema+`.deliveries
		SET attempts = attempts + 1, in_flight = true, check_runs = 0, updated_at = now()
		WHERE destination = $1 AND dedupe_key = $2 AND event_id = $3 AND state = $6
		  AND attempts = $4 AND in_flight = $5`, dest, key, id, seen.attempts, seen.inFlight, seen.state)
	if err != nil {
		return false, fmt.Errorf("webhook: ledger: claim %s/%s: %w", dest, key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// record stores an attempt's answer, moving the row from state from (the
// one its claim saw) to state: reserved when the message will be tried
// again in line, retrying when it is parked until wait from now (by the
// database's clock), or a final state. It applies only to the attempt
// this relay claimed (attempts = n): matched is false when another relay
// or an operator moved the row on (took the message over, or settled it).
//
// unsent says no byte of the request reached the receiver: the claim is
// undone (attempts back to n-1), so an unreachable receiver charges a
// message no attempt, and MaxAttempts counts requests receivers got.
// checkRuns is what the row keeps as its check's erred runs (check_runs):
// written in the same UPDATE as the state, so a row parked by its check
// comes due with them.
func (l *ledger) record(ctx context.Context, dest, key string, id int64, n int, from, state string, wait time.Duration, status int, reason string, uncertain, unsent bool, checkRuns int) (matched bool, err error) {
	tag, err := l.pool.Exec(ctx, `UPDATE `+l.schema+`.deliveries
		SET state = $5, in_flight = false, last_status = nullif($6, 0), last_error = nullif($7, ''), check_runs = $12,
		    attempts = CASE WHEN $11 THEN attempts - 1 ELSE attempts END,
		    uncertain = uncertain OR $8, updated_at = now(),
		    next_attempt_at = CASE WHEN $5 = 'retrying' THEN now() + make_interval(secs => $10) END,
		    finished_at = CASE WHEN $5 IN ('reserved', 'retrying') THEN NULL ELSE now() END
		WHERE destination = $1 AND dedupe_key = $2 AND event_id = $3 AND state = $9 AND attempts = $4`,
		dest, key, id, n, state, status, reason, uncertain, from, wait.Seconds(), unsent, checkRuns)
	if err != nil {
		return false, fmt.Errorf("webhook: ledger: record %s/%s: %w", dest, key, err)
	}
	return tag.RowsAffected() == 1, nil
}
