package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// Delivery is one row of the delivery ledger.
type Delivery struct {
	Destination string     `json:"destination"`
	DedupeKey   string     `json:"dedupe_key"`
	EventID     int64      `json:"event_id"`
	State       string     `json:"state"`
	Attempts    int        `json:"attempts"`
	Uncertain   bool       `json:"uncertain"`
	LastStatus  *int       `json:"last_status,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	Duplicates  int        `json:"duplicates"`
	ReservedAt  time.Time  `json:"reserved_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	ResolvedBy  string     `json:"resolved_by,omitempty"`
}

// Filter selects ledger rows; zero fields match everything.
type Filter struct {
	State       string
	Destination string
	Limit       int // default 100
}

var states = []string{StateWaiting, StateReserved, StateDelivered, StateFailed, StateSkipped, StateUnknown}

const deliveryColumns = `destination, dedupe_key, event_id, state, attempts, uncertain, last_status, coalesce(last_error, ''),
	cardinality(duplicates), reserved_at, updated_at, finished_at, coalesce(resolved_by, '')`

func scanDelivery(row pgx.Row) (Delivery, error) {
	var d Delivery
	err := row.Scan(&d.Destination, &d.DedupeKey, &d.EventID, &d.State, &d.Attempts, &d.Uncertain, &d.LastStatus, &d.LastError,
		&d.Duplicates, &d.ReservedAt, &d.UpdatedAt, &d.FinishedAt, &d.ResolvedBy)
	return d, err
}

// List returns ledger rows, oldest first.
func List(ctx context.Context, pool *pgxpool.Pool, schemaName string, f Filter) ([]Delivery, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	if f.State != "" && !slices.Contains(states, f.State) {
		return nil, fmt.Errorf("state: %q is not one of %s", f.State, strings.Join(states, ", "))
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := pool.Query(ctx, `SELECT `+deliveryColumns+` FROM `+id+`.deliveries
		WHERE ($1 = '' OR state = $1) AND ($2 = '' OR destination = $2)
		ORDER BY reserved_at, destination, dedupe_key LIMIT $3`, f.State, f.Destination, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("webhook: list deliveries: %w", err)
	}
	defer rows.Close()
	var out []Delivery
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			return nil, fmt.Errorf("webhook: list deliveries: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// Resolutions an operator can give a message.
const (
	ResolveDelivered = "delivered" // the receiver has it (checked by hand)
	ResolveFailed    = "failed"    // it will not be sent
	ResolveRetry     = "retry"     // send it again: a new message with the same key takes the row (waiting until a sink takes it)
)

// Resolve settles one message that is unknown, failed or skipped, in one
// transaction with an audit_log row. Retry appends the payload again as a
// new message that inherits the reservation, so the relay sends it once
// more under the same Idempotency-Key.
func Resolve(ctx context.Context, pool *pgxpool.Pool, schemaName, destination, key, action, operator string) (Delivery, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return Delivery{}, err
	}
	switch {
	case operator == "":
		return Delivery{}, errors.New("operator: must name who acts (it goes to audit_log)")
	case action != ResolveDelivered && action != ResolveFailed && action != ResolveRetry:
		return Delivery{}, fmt.Errorf("action: %q is not delivered, failed or retry", action)
	}
	var out Delivery
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var state string
		var payload []byte
		var old int64
		err := tx.QueryRow(ctx, `SELECT state, payload, event_id FROM `+id+`.deliveries
			WHERE destination = $1 AND dedupe_key = $2 FOR UPDATE`, destination, key).Scan(&state, &payload, &old)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("no message with key %q for destination %s", key, destination)
		}
		if err != nil {
			return err
		}
		if state == StateReserved || state == StateDelivered {
			return fmt.Errorf("message %q for %s is %s: only unknown, failed or skipped messages can be resolved", key, destination, state)
		}
		switch action {
		case ResolveRetry:
			var next int64
			if err := tx.QueryRow(ctx, `SELECT `+id+`.append_message($1, $2, $3)`, destination, key, string(payload)).Scan(&next); err != nil {
				return err
			}
			// Waiting, not reserved: the destination's sink takes the row
			// over when it reads the new message, and until a relay serves
			// the destination it waits in plain view, its age from now.
			_, err = tx.Exec(ctx, `UPDATE `+id+`.deliveries SET state = 'waiting', event_id = $3, attempts = 0, in_flight = false,
				uncertain = false, finished_at = NULL, reserved_at = now(), updated_at = now(), resolved_by = $4,
				last_error = 'retry requested by ' || $4 || ' (was ' || state || ')'
				WHERE destination = $1 AND dedupe_key = $2`, destination, key, next, operator)
		default:
			_, err = tx.Exec(ctx, `UPDATE `+id+`.deliveries SET state = $3, finished_at = now(), updated_at = now(), resolved_by = $4,
				last_error = concat_ws(' ', last_error, '(resolved ' || $3 || ' by ' || $4 || ')')
				WHERE destination = $1 AND dedupe_key = $2`, destination, key, action, operator)
		}
		if err != nil {
			return err
		}
		detail, _ := json.Marshal(map[string]string{"destination": destination, "dedupe_key": key, "from": state, "to": action})
		if _, err := tx.Exec(ctx, `INSERT INTO `+id+`.audit_log (operator, action, ids, detail) VALUES ($1, $2, $3, $4)`,
			operator, "deliveries."+action, []int64{old}, detail); err != nil {
			return err
		}
		out, err = scanDelivery(tx.QueryRow(ctx, `SELECT `+deliveryColumns+` FROM `+id+`.deliveries
			WHERE destination = $1 AND dedupe_key = $2`, destination, key))
		return err
	})
	if err != nil {
		return Delivery{}, fmt.Errorf("webhook: resolve %s/%s: %w", destination, key, err)
	}
	return out, nil
}
