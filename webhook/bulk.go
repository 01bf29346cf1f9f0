package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// Selection picks the ledger rows of one destination for a bulk
// resolution or a replay.
type Selection struct {
	Destination string    // required
	State       string    // required
	Since       time.Time // rows finished (or, unfinished, reserved) at or after it; zero: all
}

// BulkResult is what a bulk resolution or a replay did.
type BulkResult struct {
	Action   string   `json:"action"`
	Count    int      `json:"count"`
	Warnings []string `json:"warnings,omitempty"`
}

// ResolveAll settles every selected message (retrying, unknown, failed or
// skipped; a retrying one whose request is in flight is left to its
// answer) as Resolve settles one, in one transaction with one audit_log row that
// lists them.
func ResolveAll(ctx context.Context, pool *pgxpool.Pool, schemaName string, sel Selection, action, operator string) (BulkResult, error) {
	if err := checkResolution(action, operator); err != nil {
		return BulkResult{}, err
	}
	switch sel.State {
	case StateRetrying, StateUnknown, StateFailed, StateSkipped:
	default:
		return BulkResult{}, fmt.Errorf("state: %q: only retrying, unknown, failed or skipped messages can be resolved", sel.State)
	}
	return bulk(ctx, pool, schemaName, sel, action, "deliveries.resolve_all", operator)
}

// Replay sends the selected messages (delivered by default, or failed)
// again under their own dedupe keys, for a receiver that lost what it
// had acknowledged or refused while broken: each is appended anew and
// takes its reservation back, like a retry. One transaction, one
// audit_log row. A receiver that does not dedupe by webhook-id applies a
// replayed message that it still has a second time.
func Replay(ctx context.Context, pool *pgxpool.Pool, schemaName string, sel Selection, operator string) (BulkResult, error) {
	if operator == "" {
		return BulkResult{}, errors.New("operator: must name who acts (it goes to audit_log)")
	}
	if sel.State == "" {
		sel.State = StateDelivered
	}
	if sel.State != StateDelivered && sel.State != StateFailed {
		return BulkResult{}, fmt.Errorf("state: %q: replay re-sends delivered or failed messages (resolve the others)", sel.State)
	}
	return bulk(ctx, pool, schemaName, sel, ResolveRetry, "deliveries.replay", operator)
}

func bulk(ctx context.Context, pool *pgxpool.Pool, schemaName string, sel Selection, action, audit, operator string) (BulkResult, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return BulkResult{}, err
	}
	if sel.Destination == "" {
		return BulkResult{}, errors.New("destination: required")
	}
	res := BulkResult{Action: action}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+lockedRowColumns(id)+` FROM `+id+`.deliveries
			WHERE destination = $1 AND state = $2 AND ($3::timestamptz IS NULL OR coalesce(finished_at, reserved_at) >= $3)
			  AND NOT (state = 'retrying' AND in_flight)
			ORDER BY reserved_at, dedupe_key FOR UPDATE`, sel.Destination, sel.State, nullTime(sel.Since))
		if err != nil {
			return err
		}
		var locked []ledgerRow
		for rows.Next() {
			var r ledgerRow
			if err := rows.Scan(r.fields()...); err != nil {
				rows.Close()
				return err
			}
			locked = append(locked, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		ids, keys := make([]int64, 0, len(locked)), make([]string, 0, len(locked))
		for _, r := range locked {
			w, err := settle(ctx, tx, id, r, action, operator)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", r.destination, r.key, err)
			}
			if w != "" {
				res.Warnings = append(res.Warnings, w)
			}
			ids, keys = append(ids, r.eventID), append(keys, r.key)
		}
		res.Count = len(locked)
		detail, _ := json.Marshal(map[string]any{"destination": sel.Destination, "from": sel.State, "to": action,
			"since": nullTime(sel.Since), "count": res.Count, "keys": keys})
		_, err = tx.Exec(ctx, `INSERT INTO `+id+`.audit_log (operator, action, ids, detail) VALUES ($1, $2, $3, $4)`,
			operator, audit, ids, detail)
		return err
	})
	if err != nil {
		return BulkResult{}, fmt.Errorf("webhook: %s %s: %w", audit, sel.Destination, err)
	}
	return res, nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
