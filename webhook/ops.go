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
	CheckRuns   int        `json:"check_runs"` // the check's transient errors in a row, no request sent; they count towards max_attempts
	Uncertain   bool       `json:"uncertain"`
	LastStatus  *int       `json:"last_status,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	Duplicates  int        `json:"duplicates"`
	ReservedAt  time.Time  `json:"reserved_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	// NextAttemptAt is when a retrying message is due (the database's clock).
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	ResolvedBy    string     `json:"resolved_by,omitempty"`
	// Warning is set by Resolve for a retry that may give a second effect.
	Warning string `json:"warning,omitempty"`
}

// Filter selects ledger rows; zero fields match everything.
type Filter struct {
	State       string
	Destination string
	Limit       int // default 100
}

var states = []string{StateWaiting, StateReserved, StateRetrying, StateDelivered, StateFailed, StateSkipped, StateUnknown}

const deliveryColumns = `destination, dedupe_key, event_id, state, attempts, check_runs, uncertain, last_status, coalesce(last_error, ''),
	cardinality(duplicates), reserved_at, updated_at, finished_at, next_attempt_at, coalesce(resolved_by, '')`

func scanDelivery(row pgx.Row) (Delivery, error) {
	var d Delivery
	err := row.Scan(&d.Destination, &d.DedupeKey, &d.EventID, &d.State, &d.Attempts, &d.CheckRuns, &d.Uncertain, &d.LastStatus, &d.LastError,
		&d.Duplicates, &d.ReservedAt, &d.UpdatedAt, &d.FinishedAt, &d.NextAttemptAt, &d.ResolvedBy)
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

// Resolve settles one message that is retrying (parked between attempts,
// none in flight), unknown, failed or skipped, in one transaction with an
// audit_log row: the destination's leader then sends it no more. Retry appends the payload again as a
// new message that inherits the reservation, so the relay sends it once
// more under the same Idempotency-Key. A retry of a message that was ever
// unknown (resolved failed since, or retried and failed again) comes back
// with a Warning: the receiver may already have applied it.
func Resolve(ctx context.Context, pool *pgxpool.Pool, schemaName, destination, key, action, operator string) (Delivery, error) {
	return resolveOne(ctx, pool, schemaName, destination, key, action, operator, false)
}

// ResolveAbandoned is Resolve that also settles a reserved message, for a
// row that no relay works on any more (its destination's stream has no
// leader: the caller checks): a leader that died mid-request leaves it
// reserved until a relay serving the destination takes it over, and an
// operator who has checked with the receiver need not wait for that; so
// is a retrying message whose retry was in flight. A retry of a row whose
// request may have been written warns like one of an unknown message.
func ResolveAbandoned(ctx context.Context, pool *pgxpool.Pool, schemaName, destination, key, action, operator string) (Delivery, error) {
	return resolveOne(ctx, pool, schemaName, destination, key, action, operator, true)
}

func resolveOne(ctx context.Context, pool *pgxpool.Pool, schemaName, destination, key, action, operator string, reserved bool) (Delivery, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return Delivery{}, err
	}
	if err := checkResolution(action, operator); err != nil {
		return Delivery{}, err
	}
	var out Delivery
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var row ledgerRow
		err := tx.QueryRow(ctx, `SELECT `+lockedRowColumns(id)+` FROM `+id+`.deliveries
			WHERE destination = $1 AND dedupe_key = $2 FOR UPDATE`, destination, key).Scan(row.fields()...)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("no message with key %q for destination %s", key, destination)
		}
		if err != nil {
			return err
		}
		switch {
		case row.state == StateReserved && reserved:
			// in_flight or attempts > 0: a request may have been written.
			row.onceUnknown = row.onceUnknown || row.attempted
		case row.state == StateRetrying && row.inFlight && reserved:
			row.onceUnknown = true // its last request may have been written
		case row.state == StateRetrying && row.inFlight:
			return fmt.Errorf("message %q for %s is retrying and a request of it is in flight: resolve it once that is answered", key, destination)
		case row.state == StateReserved || row.state == StateDelivered:
			return fmt.Errorf("message %q for %s is %s: only retrying, unknown, failed or skipped messages can be resolved", key, destination, row.state)
		}
		warning, err := settle(ctx, tx, id, row, action, operator)
		if err != nil {
			return err
		}
		detail, _ := json.Marshal(map[string]string{"destination": destination, "dedupe_key": key, "from": row.state, "to": action})
		if _, err := tx.Exec(ctx, `INSERT INTO `+id+`.audit_log (operator, action, ids, detail) VALUES ($1, $2, $3, $4)`,
			operator, "deliveries."+action, []int64{row.eventID}, detail); err != nil {
			return err
		}
		out, err = scanDelivery(tx.QueryRow(ctx, `SELECT `+deliveryColumns+` FROM `+id+`.deliveries
			WHERE destination = $1 AND dedupe_key = $2`, destination, key))
		out.Warning = warning
		return err
	})
	if err != nil {
		return Delivery{}, fmt.Errorf("webhook: resolve %s/%s: %w", destination, key, err)
	}
	return out, nil
}

func checkResolution(action, operator string) error {
	switch {
	case operator == "":
		return errors.New("operator: must name who acts (it goes to audit_log)")
	case action != ResolveDelivered && action != ResolveFailed && action != ResolveRetry:
		return fmt.Errorf("action: %q is not delivered, failed or retry", action)
	}
	return nil
}

// ledgerRow is what settle needs of a row locked FOR UPDATE.
type ledgerRow struct {
	destination, key, state string
	payload                 []byte
	eventID                 int64
	onceUnknown             bool
	attempted               bool // some attempt was claimed: a request may have been written
	inFlight                bool // an attempt is claimed and not answered
}

// lockedRowColumns reads a ledgerRow; once_unknown is true when some
// attempt may have reached the receiver, or the audit log shows the row
// was unknown before an operator moved it on.
func lockedRowColumns(id string) string {
	return `destination, dedupe_key, state, payload, event_id, uncertain OR state = 'unknown' OR EXISTS (
	SELECT 1 FROM ` + id + `.audit_log a WHERE a.action LIKE 'deliveries.%' AND a.detail->>'from' = 'unknown'
	  AND a.detail->>'destination' = deliveries.destination
	  AND (a.detail->>'dedupe_key' = deliveries.dedupe_key OR a.detail->'keys' ? deliveries.dedupe_key)),
	in_flight OR attempts > 0, in_flight`
}

func (r *ledgerRow) fields() []any {
	return []any{&r.destination, &r.key, &r.state, &r.payload, &r.eventID, &r.onceUnknown, &r.attempted, &r.inFlight}
}

// settle applies one resolution to a locked row and returns a warning for
// a retry that may give a second effect.
func settle(ctx context.Context, tx pgx.Tx, id string, row ledgerRow, action, operator string) (warning string, err error) {
	if action != ResolveRetry {
		_, err = tx.Exec(ctx, `UPDATE `+id+`.deliveries SET state = $3, finished_at = now(), updated_at = now(), resolved_by = $4, next_attempt_at = NULL,
			last_error = concat_ws(' ', last_error, '(resolved ' || $3 || ' by ' || $4 || ')')
			WHERE destination = $1 AND dedupe_key = $2`, row.destination, row.key, action, operator)
		return "", err
	}
	var next int64
	if err := tx.QueryRow(ctx, `SELECT `+id+`.append_message($1, $2, $3)`, row.destination, row.key, string(row.payload)).Scan(&next); err != nil {
		return "", err
	}
	// Waiting, not reserved: the destination's sink takes the row over
	// when it reads the new message, and until a relay serves the
	// destination it waits in plain view, its age from now.
	_, err = tx.Exec(ctx, `UPDATE `+id+`.deliveries SET state = 'waiting', event_id = $3, attempts = 0, check_runs = 0, in_flight = false,
		uncertain = false, finished_at = NULL, reserved_at = now(), updated_at = now(), resolved_by = $4, next_attempt_at = NULL,
		last_error = 'retry requested by ' || $4 || ' (was ' || state || ')'
		WHERE destination = $1 AND dedupe_key = $2`, row.destination, row.key, next, operator)
	if row.onceUnknown && row.state != StateDelivered {
		warning = fmt.Sprintf("%s/%s was unknown once: the receiver may already have applied it, and this retry may produce a second effect unless it dedupes by webhook-id", row.destination, row.key)
	}
	return warning, err
}
