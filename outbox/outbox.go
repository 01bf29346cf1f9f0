package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/schema"
)

// DB is the smallest interface that pgx.Tx, *pgx.Conn and *pgxpool.Pool
// satisfy. Pass the caller's transaction so the event commits, or rolls
// back, with the business row.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
}

// Outbox appends events to one outbox schema.
type Outbox struct {
	schema string
	ident  string
}

// NewOutbox returns the outbox in the named schema (schema.DefaultName if empty).
func NewOutbox(schemaName string) (*Outbox, error) {
	if schemaName == "" {
		schemaName = schema.DefaultName
	}
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	return &Outbox{schema: schemaName, ident: id}, nil
}

// Schema is the quoted schema identifier, ready to splice into SQL.
func (o *Outbox) Schema() string { return o.ident }

// SchemaName is the unquoted schema name.
func (o *Outbox) SchemaName() string { return o.schema }

// ValidationError names the event field that is wrong and why.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string { return "outboxd: " + e.Field + ": " + e.Reason }

// Validate checks e against the same rules as the SQL append function.
func Validate(e *Event) error {
	switch {
	case e.SourceID == "":
		return &ValidationError{"source_id", "must not be empty"}
	case len(e.SourceID) > 512:
		return &ValidationError{"source_id", fmt.Sprintf("%d bytes, Elasticsearch allows at most 512", len(e.SourceID))}
	case e.Version < 0:
		return &ValidationError{"version", fmt.Sprintf("must be >= 1 (or 0 for auto), got %d", e.Version)}
	case e.Op != OpUpsert && e.Op != OpDelete:
		return &ValidationError{"op", fmt.Sprintf("must be upsert or delete, got %q", e.Op)}
	case e.Op == OpUpsert && !isObject(e.Document):
		return &ValidationError{"document", "an upsert needs a JSON object"}
	case e.Op == OpUpsert && ReservedField(e.Document) != "":
		return &ValidationError{"document", fmt.Sprintf("the top-level field %s is reserved (it marks a delete's tombstone in the index)", ReservedField(e.Document))}
	case e.Op == OpDelete && len(e.Document) > 0 && string(e.Document) != "null":
		return &ValidationError{"document", "a delete must not carry a document"}
	case len(e.Headers) > 0 && !isObject(e.Headers):
		return &ValidationError{"headers", "must be a JSON object"}
	}
	return ValidateIndexName(e.IndexName)
}

// ReservedFields are the top-level document fields the index keeps for
// itself (indexer.TombstoneField and indexer.TombstoneAtField): a document
// carrying one would be hidden or purged as a tombstone.
var ReservedFields = []string{"outboxd_deleted", "outboxd_deleted_at"}

// ReservedField returns the first reserved top-level field of the JSON
// object doc, or "" when it has none (or is not an object).
func ReservedField(doc json.RawMessage) string {
	if !mayHoldReserved(doc) {
		return "" // the common case, without decoding
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(doc, &fields) != nil {
		return ""
	}
	for _, f := range ReservedFields {
		if _, ok := fields[f]; ok {
			return f
		}
	}
	return ""
}

// mayHoldReserved reports whether doc spells "outboxd_deleted" or holds a
// \u escape (a key may be spelled with escapes). It looks for the 'x' of
// outboxd, rare in text, and the backslash, not for the word: searching
// for its 'o' stopped at every o of a document's prose, and was a sixth
// of a backfill's CPU at 1 KB a row (20 times slower than this).
func mayHoldReserved(doc []byte) bool {
	const word, x = "outboxd_deleted", 5 // word[x] == 'x'
	for i := 0; i < len(doc); {
		j := bytes.IndexByte(doc[i:], 'x')
		if j < 0 {
			break
		}
		if k := i + j; k >= x && bytes.HasPrefix(doc[k-x:], []byte(word)) {
			return true
		}
		i += j + 1
	}
	return bytes.IndexByte(doc, '\\') >= 0 && bytes.Contains(doc, []byte(`\u`))
}

func isObject(b json.RawMessage) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return json.Valid(b)
		}
		return false
	}
	return false
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

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// refuse fails a statement on db with err's text, so a refused event aborts
// the caller's transaction just as the SQL append would: a caller that
// ignores the error cannot commit the business row without its event.
// Validate alone checks an event without touching the database.
func (o *Outbox) refuse(ctx context.Context, db DB, err error) error {
	_, _ = db.Exec(ctx, `SELECT `+o.ident+`.refuse($1)`, err.Error())
	return err
}

// Append writes one event inside db (normally the caller's transaction) and
// returns its id. A Version of 0 asks the outbox for the next version of
// (IndexName, SourceID). An invalid event returns a *ValidationError and
// aborts the transaction.
func (o *Outbox) Append(ctx context.Context, db DB, e Event) (int64, error) {
	if err := Validate(&e); err != nil {
		return 0, o.refuse(ctx, db, err)
	}
	sql, args := o.statement(&e)
	var id int64
	if err := db.QueryRow(ctx, sql, args...).Scan(&id); err != nil {
		return 0, fmt.Errorf("outboxd: append: %w", err)
	}
	return id, nil
}

// Queue adds e's append to the caller's batch, so the event costs no round
// trip of its own: queue the business statements and the event, then send
// the batch (in a transaction, or alone, where pgx runs a batch as one
// implicit transaction). An invalid event returns a *ValidationError and
// queues a statement that fails the batch, so it cannot commit without it.
func (o *Outbox) Queue(b *pgx.Batch, e Event) error {
	if err := Validate(&e); err != nil {
		b.Queue(`SELECT `+o.ident+`.refuse($1)`, err.Error())
		return err
	}
	sql, args := o.statement(&e)
	b.Queue(sql, args...)
	return nil
}

// statement is the SQL that appends a valid e and returns its id: a plain
// INSERT for an explicit version, the SQL append (which owns the counter)
// for an automatic one. The schema's outboxd_check trigger checks both
// again on the server.
func (o *Outbox) statement(e *Event) (string, []any) {
	if e.Version == 0 {
		return `SELECT ` + o.ident + `.append($1, $2, NULL, $3, $4, $5, $6)`,
			[]any{e.IndexName, e.SourceID, string(e.Op), nullable(e.Document), nullString(e.EventType), nullable(e.Headers)}
	}
	return `INSERT INTO ` + o.ident + `.events
			(index_name, source_id, version, op, document, event_type, headers, occurred_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8, now())) RETURNING id`,
		[]any{e.IndexName, e.SourceID, e.Version, string(e.Op), nullable(e.Document), nullString(e.EventType), nullable(e.Headers), nullTime(e.OccurredAt)}
}

// AppendBatch writes many events in one round trip. Events with explicit
// versions go through COPY; auto-versioned ones through one batch of
// append calls. It returns how many events were written. Pass a
// transaction: on a pool the COPY and the batch may commit separately.
// One invalid event refuses the whole batch and aborts the transaction.
func (o *Outbox) AppendBatch(ctx context.Context, db DB, events []Event) (int64, error) {
	for i := range events {
		if err := Validate(&events[i]); err != nil {
			return 0, o.refuse(ctx, db, fmt.Errorf("event %d: %w", i, err))
		}
	}
	var explicit [][]any
	var auto pgx.Batch
	for _, e := range events {
		if e.Version == 0 {
			sql, args := o.statement(&e)
			auto.Queue(sql, args...)
			continue
		}
		occurred := e.OccurredAt
		if occurred.IsZero() {
			occurred = time.Now()
		}
		explicit = append(explicit, []any{e.IndexName, e.SourceID, e.Version, string(e.Op), nullable(e.Document), nullString(e.EventType), nullable(e.Headers), occurred})
	}
	var n int64
	if len(explicit) > 0 {
		c, err := db.CopyFrom(ctx, pgx.Identifier{o.schema, "events"},
			[]string{"index_name", "source_id", "version", "op", "document", "event_type", "headers", "occurred_at"},
			pgx.CopyFromRows(explicit))
		if err != nil {
			return 0, fmt.Errorf("outboxd: append batch: %w", err)
		}
		n += c
	}
	if auto.Len() > 0 {
		br := db.SendBatch(ctx, &auto)
		for i := 0; i < auto.Len(); i++ {
			if _, err := br.Exec(); err != nil {
				br.Close()
				return 0, fmt.Errorf("outboxd: append batch: %w", err)
			}
			n++
		}
		if err := br.Close(); err != nil {
			return 0, fmt.Errorf("outboxd: append batch: %w", err)
		}
	}
	return n, nil
}
