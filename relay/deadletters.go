package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// Dead-letter statuses. A parked dead letter waits for an operator; retried
// and discarded are final and keep who resolved it and when.
const (
	DeadLetterParked    = "parked"
	DeadLetterRetried   = "retried"
	DeadLetterDiscarded = "discarded"
)

// ErrDeadLetterNotFound is wrapped by GetDeadLetter when no row has the id.
var ErrDeadLetterNotFound = errors.New("dead letter not found")

// DeadLetter is an event the relay parked, as an operator sees it.
type DeadLetter struct {
	ID            int64           `json:"id"`
	EventID       int64           `json:"event_id"`
	Stream        string          `json:"stream"`
	Index         string          `json:"index"`
	SourceID      string          `json:"source_id"`
	Version       int64           `json:"version"`
	Op            outbox.Op       `json:"op"`
	Document      json.RawMessage `json:"document,omitempty"`
	EventType     string          `json:"event_type,omitempty"`
	Headers       json.RawMessage `json:"headers,omitempty"`
	OccurredAt    time.Time       `json:"occurred_at"`
	Kind          string          `json:"kind"` // KindRejected or KindGaveUp
	Reason        string          `json:"reason"`
	Attempts      int             `json:"attempts"`
	FirstFailedAt time.Time       `json:"first_failed_at"`
	LastFailedAt  time.Time       `json:"last_failed_at"`
	Status        string          `json:"status"`
	ResolvedAt    *time.Time      `json:"resolved_at,omitempty"`
	ResolvedBy    string          `json:"resolved_by,omitempty"`
}

// Kinds of dead letters: why an event was parked.
const (
	KindRejected = "rejected" // the sink will never accept the event as it is
	KindGaveUp   = "gave_up"  // transient failures past Config.MaxAttempts
)

// DeadLetterFilter selects dead letters. Empty fields do not filter.
//
// For ListDeadLetters, Status "" means every status, AfterID and Limit page
// through the result in id order (Limit defaults to 100).
//
// For RetryDeadLetters and DiscardDeadLetters only parked dead letters are
// ever touched, and the filter must select something on purpose: IDs, Index,
// SourceID, ReasonContains or Kind, or All, so an empty filter never resolves the
// whole table by accident.
type DeadLetterFilter struct {
	IDs            []int64 `json:"ids,omitempty"`
	Index          string  `json:"index,omitempty"`
	Status         string  `json:"status,omitempty"`
	SourceID       string  `json:"source_id,omitempty"`
	ReasonContains string  `json:"reason_contains,omitempty"`
	Kind           string  `json:"kind,omitempty"` // KindRejected or KindGaveUp
	All            bool    `json:"all,omitempty"`
	AfterID        int64   `json:"after_id,omitempty"`
	Limit          int     `json:"limit,omitempty"`
}

// Beginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// (a savepoint) all do. Resolving dead letters needs one so that the
// re-queued events, the status change and the audit row commit together.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

const deadLetterColumns = `id, event_id, stream, index_name, source_id, version, op, document, event_type, headers,
	occurred_at, reason, attempts, first_failed_at, last_failed_at, status, resolved_at, resolved_by, kind`

func scanDeadLetter(row pgx.CollectableRow) (DeadLetter, error) {
	var d DeadLetter
	var op string
	var eventType, resolvedBy *string
	var doc, headers []byte
	err := row.Scan(&d.ID, &d.EventID, &d.Stream, &d.Index, &d.SourceID, &d.Version, &op, &doc, &eventType, &headers,
		&d.OccurredAt, &d.Reason, &d.Attempts, &d.FirstFailedAt, &d.LastFailedAt, &d.Status, &d.ResolvedAt, &resolvedBy, &d.Kind)
	d.Op = outbox.Op(op)
	d.Document, d.Headers = doc, headers
	if eventType != nil {
		d.EventType = *eventType
	}
	if resolvedBy != nil {
		d.ResolvedBy = *resolvedBy
	}
	return d, err
}

// where renders f as SQL conditions over dead_letters with numbered
// parameters.
func (f *DeadLetterFilter) where() (string, []any, error) {
	var conds []string
	var args []any
	add := func(cond string, arg any) {
		args = append(args, arg)
		conds = append(conds, strings.ReplaceAll(cond, "$?", "$"+strconv.Itoa(len(args))))
	}
	switch f.Status {
	case "", DeadLetterParked, DeadLetterRetried, DeadLetterDiscarded:
	default:
		return "", nil, fmt.Errorf("status: must be parked, retried or discarded, got %q", f.Status)
	}
	if f.Limit < 0 {
		return "", nil, fmt.Errorf("limit: must be >= 0, got %d", f.Limit)
	}
	if len(f.IDs) > 0 {
		add("id = ANY($?)", f.IDs)
	}
	if f.Index != "" {
		add("index_name = $?", f.Index)
	}
	if f.Status != "" {
		add("status = $?", f.Status)
	}
	if f.SourceID != "" {
		add("source_id = $?", f.SourceID)
	}
	if f.Kind != "" {
		add("kind = $?", f.Kind)
	}
	if f.ReasonContains != "" {
		add("strpos(lower(reason), lower($?)) > 0", f.ReasonContains)
	}
	if f.AfterID > 0 {
		add("id > $?", f.AfterID)
	}
	if len(conds) == 0 {
		return "true", nil, nil
	}
	return strings.Join(conds, " AND "), args, nil
}

// ListDeadLetters returns dead letters matching f in id order.
func ListDeadLetters(ctx context.Context, db outbox.DB, schemaName string, f DeadLetterFilter) ([]DeadLetter, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	where, args, err := f.where()
	if err != nil {
		return nil, fmt.Errorf("relay: dead letters: %w", err)
	}
	limit := f.Limit
	if limit == 0 {
		limit = 100
	}
	args = append(args, limit)
	rows, err := db.Query(ctx, `SELECT `+deadLetterColumns+` FROM `+id+`.dead_letters WHERE `+where+
		` ORDER BY id LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("relay: dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("relay: dead letters: %w", err)
	}
	return out, nil
}

// GetDeadLetter returns one dead letter; the error wraps
// ErrDeadLetterNotFound when there is none with that id.
func GetDeadLetter(ctx context.Context, db outbox.DB, schemaName string, dlID int64) (*DeadLetter, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT `+deadLetterColumns+` FROM `+id+`.dead_letters WHERE id = $1`, dlID)
	if err != nil {
		return nil, fmt.Errorf("relay: dead letter %d: %w", dlID, err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("relay: dead letter %d: %w", dlID, ErrDeadLetterNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("relay: dead letter %d: %w", dlID, err)
	}
	return &d, nil
}

// RetryDeadLetters re-queues the parked dead letters f selects through the
// normal path: each becomes a new outbox event with the same index, source
// id, version, op, document and headers, so the relay delivers it like any
// other and the sink's version check still applies (a retried version older
// than the indexed one is counted stale, never applied over it). The new
// events, the status change and an audit_log row commit in one transaction.
// It returns how many dead letters were re-queued.
func RetryDeadLetters(ctx context.Context, db Beginner, schemaName string, f DeadLetterFilter, operator string) (int, error) {
	return resolveDeadLetters(ctx, db, schemaName, f, operator, DeadLetterRetried)
}

// DiscardDeadLetters marks the parked dead letters f selects as discarded,
// with an audit_log row, in one transaction. It returns how many it marked.
func DiscardDeadLetters(ctx context.Context, db Beginner, schemaName string, f DeadLetterFilter, operator string) (int, error) {
	return resolveDeadLetters(ctx, db, schemaName, f, operator, DeadLetterDiscarded)
}

func resolveDeadLetters(ctx context.Context, db Beginner, schemaName string, f DeadLetterFilter, operator, to string) (int, error) {
	action := "retry"
	if to == DeadLetterDiscarded {
		action = "discard"
	}
	fail := func(err error) (int, error) { return 0, fmt.Errorf("relay: dead letters: %s: %w", action, err) }
	id, err := schema.Ident(schemaName)
	if err != nil {
		return 0, err
	}
	switch {
	case strings.TrimSpace(operator) == "":
		return fail(errors.New("operator: must name who acts (it goes to audit_log)"))
	case f.Status != "" && f.Status != DeadLetterParked:
		return fail(fmt.Errorf("status: only parked dead letters can be resolved, got %q", f.Status))
	case !f.All && len(f.IDs) == 0 && f.Index == "" && f.SourceID == "" && f.ReasonContains == "" && f.Kind == "":
		return fail(errors.New("select dead letters by ids, index, source id or reason, or set All"))
	}
	sel := f
	sel.Status = DeadLetterParked
	where, args, err := sel.where()
	if err != nil {
		return fail(err)
	}
	limit := ""
	if f.Limit > 0 {
		limit = " LIMIT " + strconv.Itoa(f.Limit)
	}
	n := len(args)
	args = append(args, to, operator)
	// FOR UPDATE makes two operators acting at once resolve each dead
	// letter once: the second waits, then finds it no longer parked.
	q := `WITH sel AS (
  SELECT id FROM ` + id + `.dead_letters WHERE ` + where + ` ORDER BY id` + limit + ` FOR UPDATE
)
UPDATE ` + id + `.dead_letters d SET status = $` + strconv.Itoa(n+1) + `, resolved_at = now(), resolved_by = $` + strconv.Itoa(n+2) + `
FROM sel WHERE d.id = sel.id AND d.status = 'parked'
RETURNING d.id`

	var ids, events []int64
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return err
		}
		if to == DeadLetterRetried && len(ids) > 0 {
			// One statement, in dead-letter id order: versions of one
			// source are re-queued in the order they were parked.
			rows, err := tx.Query(ctx, `INSERT INTO `+id+`.events
  (index_name, source_id, version, op, document, event_type, headers, occurred_at)
SELECT index_name, source_id, version, op, document, event_type, headers, occurred_at
FROM `+id+`.dead_letters WHERE id = ANY($1) ORDER BY id
RETURNING id`, ids)
			if err != nil {
				return err
			}
			if events, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				return err
			}
		}
		detail := map[string]any{"filter": f, "count": len(ids)}
		if events != nil {
			detail["event_ids"] = events
		}
		b, err := json.Marshal(detail)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+id+`.audit_log (operator, action, ids, detail) VALUES ($1, $2, $3, $4)`,
			operator, "deadletters."+action, ids, b)
		return err
	})
	if err != nil {
		return fail(err)
	}
	return len(ids), nil
}

// deadLetter is an event the relay gave up on, with why.
type deadLetter struct {
	event    outbox.Event
	kind     string // KindRejected or KindGaveUp
	reason   string
	attempts int
	first    time.Time
	last     time.Time
}

func parkDeadLetters(ctx context.Context, tx pgx.Tx, schemaName, stream string, dead []deadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	rows := make([][]any, len(dead))
	for i, d := range dead {
		e := d.event
		rows[i] = []any{e.ID, stream, e.IndexName, e.SourceID, e.Version, string(e.Op), nullable(e.Document),
			nullString(e.EventType), nullable(e.Headers), e.OccurredAt, d.reason, d.attempts, d.first, d.last, d.kind}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{schemaName, "dead_letters"},
		[]string{"event_id", "stream", "index_name", "source_id", "version", "op", "document", "event_type", "headers",
			"occurred_at", "reason", "attempts", "first_failed_at", "last_failed_at", "kind"},
		pgx.CopyFromRows(rows))
	return err
}

func nullable(b json.RawMessage) any {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	return []byte(b)
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
