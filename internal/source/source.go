// Package source reads the rows of a source query (id, version, document
// and optionally deleted) as events, in the id's own order through a
// server-side cursor, in a read-only snapshot: what backfill streams to
// the sink and rebuild --from source copies into the new index.
//
// For a definition-fed index (package documents) the rows are its
// definition's documents instead: the ids of its ids query, read through
// the same kind of cursor (DeclareIDs), are read in batches by
// documents.Reader, each read in a snapshot and at a version of its own
// that order it with the relay's reads of the same documents
// (definition.go).
package source

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/outbox"
)

// Query is a source query and how it is read: the fields of the options
// of the tools that read one (backfill, rebuild from source).
type Query struct {
	// SourceSQL returns id, version, document and optionally a boolean
	// deleted column.
	SourceSQL     string
	Index         string        // the index name N of the events
	Batch         int           // rows per batch at most
	BatchBytes    int           // bytes of ids and documents per batch (Reader)
	SourceTimeout time.Duration // statement timeout of each FETCH
}

// Reject is one row or document a tool could not write, and why: refused
// by the sink or Elasticsearch, or failed past its attempts.
type Reject struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

// Declare opens the cursor over SourceSQL after key after.
// The key travels as a setting, not spliced into the SQL: DECLARE takes no
// bind parameters.
//
// Rows are ordered by the id column in its own type (bigint, uuid, text
// in its collation, ...), so that a query over a table whose primary key
// it returns reads the key's index in order and resumes with an index
// condition: ordering by the id's text would sort the whole table before
// the first row, and put 10 before 2. An id of a type without a btree
// ordering (json, a record) is ordered by its text in byte order instead.
func Declare(ctx context.Context, tx pgx.Tx, o Query, after string) error {
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true), set_config('outboxd.backfill_after', $2, true)`,
		fmt.Sprint(o.SourceTimeout.Milliseconds()), after); err != nil {
		return fmt.Errorf("indexer: backfill: %w", err)
	}
	shape, err := Describe(ctx, tx, o.SourceSQL)
	if err != nil {
		return err
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("indexer: backfill: %w", err)
	}
	_, err = sp.Exec(ctx, CursorSQL(o.SourceSQL, shape.KeyType, shape.Cols, after != ""))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42883" || pe.Code == "42846") {
		// undefined_function (no ordering operator) or cannot_coerce (no
		// cast from text): order by the id's text.
		if err := sp.Rollback(ctx); err != nil {
			return fmt.Errorf("indexer: backfill: %w", err)
		}
		_, err = tx.Exec(ctx, CursorSQL(o.SourceSQL, "", shape.Cols, after != ""))
	} else if err == nil {
		err = sp.Commit(ctx)
	}
	if err != nil {
		return fmt.Errorf("indexer: backfill: source_sql: %w", err)
	}
	return nil
}

// Shape is what the columns of SourceSQL are.
type Shape struct {
	KeyType string // the SQL name of the id's type with its modifier, from the catalog (quoted as needed)
	Cols    int    // 3 or 4
	DocOID  uint32 // the document's type
}

// ValidJSON reports a document column of type json or jsonb: PostgreSQL
// has validated every document.
func (s Shape) ValidJSON() bool {
	return s.DocOID == pgtype.JSONOID || s.DocOID == pgtype.JSONBOID
}

// Describe describes SourceSQL without running it.
func Describe(ctx context.Context, tx pgx.Tx, sql string) (Shape, error) {
	sd, err := tx.Conn().PgConn().Prepare(ctx, "", sql, nil)
	if err != nil {
		return Shape{}, fmt.Errorf("indexer: backfill: source_sql: %w", err)
	}
	sh := Shape{Cols: len(sd.Fields)}
	if sh.Cols != 3 && sh.Cols != 4 {
		return Shape{}, fmt.Errorf("indexer: backfill: source_sql: returns %d columns; want id, version, document and optionally deleted", sh.Cols)
	}
	sh.DocOID = sd.Fields[2].DataTypeOID
	if sh.Cols == 4 && sd.Fields[3].DataTypeOID != pgtype.BoolOID {
		var typ string
		_ = tx.QueryRow(ctx, `SELECT format_type($1, NULL)`, sd.Fields[3].DataTypeOID).Scan(&typ)
		return Shape{}, fmt.Errorf("indexer: backfill: source_sql: the fourth column (deleted) is of type %s; want boolean", typ)
	}
	// With its modifier: char(8), not character (which is char(1), and
	// would cut the stored key to its first letter); numeric(10,2).
	if err := tx.QueryRow(ctx, `SELECT format_type($1, nullif($2::int, -1))`, sd.Fields[0].DataTypeOID, sd.Fields[0].TypeModifier).Scan(&sh.KeyType); err != nil {
		return Shape{}, fmt.Errorf("indexer: backfill: %w", err)
	}
	return sh, nil
}

// CursorSQL is the cursor over sql (of cols columns: 1 for an ids query,
// 3 or 4 for a source query) ordered by
// its id, in keyType ("" for the id's text in byte order), after the key
// in the setting outboxd.backfill_after when resume. The id is returned as
// text, the form in which it is stored and becomes the document's _id.
func CursorSQL(sql, keyType string, cols int, resume bool) string {
	key := "src.id"
	after := "CAST(current_setting('outboxd.backfill_after') AS " + keyType + ")"
	if keyType == "" {
		key = `src.id::text COLLATE "C"`
		after = "current_setting('outboxd.backfill_after')"
	}
	names, out := "id, version, document", "src.id::text, src.version::text, src.document"
	switch cols {
	case 1: // an ids query (DeclareIDs)
		names, out = "id", "src.id::text"
	case 4:
		names, out = names+", deleted", out+", src.deleted"
	}
	q := `DECLARE outboxd_backfill NO SCROLL CURSOR FOR
SELECT ` + out + ` FROM (` + sql + `
) AS src(` + names + `)`
	if resume {
		q += "\nWHERE " + key + " > " + after
	}
	return q + "\nORDER BY " + key
}

// Estimate is the planner's estimate of the query's rows, for the
// progress bar's ETA: counting them would read the table twice.
func Estimate(ctx context.Context, tx pgx.Tx, sql string) int64 {
	var plan []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql).Scan(&plan); err != nil || len(plan) == 0 {
		return 0
	}
	return int64(plan[0].Plan.Rows)
}

// Batch is one batch of rows: the events for the sink, and the
// rows rejected before it, each by its own id.
type Batch struct {
	Events   []outbox.Event
	Rejected []Reject
	Rows     int    // rows read, rejected ones included
	Bytes    int    // of ids and documents
	Last     string // the id of the last row read with an id
}

func (b *Batch) add(r *cursorRow, index string) {
	b.Rows++
	b.Bytes += r.size()
	if r.id.Valid {
		b.Last = r.id.String
	}
	e := outbox.Event{IndexName: index}
	if reason := r.event(&e); reason != "" {
		b.Rejected = append(b.Rejected, Reject{ID: r.id.String, Reason: reason})
		return
	}
	b.Events = append(b.Events, e)
}

// Reader cuts the cursor's rows into batches of at most Batch
// rows and BatchBytes bytes (or one row, when that row alone is larger),
// whatever the rows weigh. Each FETCH asks for as many rows as the
// largest row of the previous one says fit in what the batch has left; a
// FETCH that returns more than fits is read on into the next batch rather
// than held whole, so memory never exceeds a batch and one row. (Such a
// FETCH stays open while the batch before it waits for a slot at the
// sink; it is at most a FETCH sized by smaller rows, so well within the
// statement timeout.)
type Reader struct {
	tx      pgx.Tx
	o       Query
	rows    pgx.Rows // the FETCH being read, nil between them
	asked   int      // rows it asked for
	got     int      // rows it returned so far
	largest int      // the largest row of the last FETCH
	held    *cursorRow
	done    bool // a FETCH returned fewer rows than it asked for
}

// NewReader reads the cursor Declare opened on tx in batches of o.
func NewReader(tx pgx.Tx, o Query) *Reader { return &Reader{tx: tx, o: o} }

// firstFetch is how many rows the first FETCH asks for, before any row's
// size is known.
const firstFetch = 64

func (r *Reader) Next(ctx context.Context) (Batch, error) {
	b := Batch{Events: make([]outbox.Event, 0, min(r.o.Batch, 1024))}
	if r.held != nil {
		b.add(r.held, r.o.Index)
		r.held = nil
	}
	for b.Rows < r.o.Batch {
		if r.rows == nil {
			if r.done {
				break
			}
			if err := r.fetch(ctx, &b); err != nil {
				return Batch{}, err
			}
		}
		if !r.rows.Next() {
			err := r.rows.Err()
			r.rows.Close()
			r.rows = nil
			if err != nil {
				return Batch{}, fmt.Errorf("indexer: backfill: source_sql: %w", err)
			}
			r.done = r.got < r.asked
			continue
		}
		row := &cursorRow{}
		if err := scanRow(r.rows, row); err != nil {
			return Batch{}, fmt.Errorf("indexer: backfill: source_sql: row after %q: %w", b.Last, err)
		}
		r.got++
		r.largest = max(r.largest, row.size())
		if b.Rows > 0 && b.Bytes+row.size() > r.o.BatchBytes {
			r.held = row
			break
		}
		b.add(row, r.o.Index)
	}
	return b, nil
}

// fetch starts the next FETCH, sized by the largest row seen so far.
func (r *Reader) fetch(ctx context.Context, b *Batch) error {
	n := r.o.Batch - b.Rows
	if r.largest == 0 {
		n = min(n, firstFetch)
	} else {
		n = min(n, max(1, (r.o.BatchBytes-b.Bytes)/r.largest))
	}
	rows, err := r.tx.Query(ctx, fmt.Sprintf("FETCH FORWARD %d FROM outboxd_backfill", n))
	if err != nil {
		return fmt.Errorf("indexer: backfill: source_sql: %w", err)
	}
	r.rows, r.asked, r.got, r.largest = rows, n, 0, 0
	return nil
}

// Close ends a FETCH left open by an error or a cancellation.
func (r *Reader) Close() {
	if r.rows != nil {
		r.rows.Close()
		r.rows = nil
	}
}

// Fetch reads the next o.Batch rows as events; a row that cannot
// be read is an error naming it.
func Fetch(ctx context.Context, tx pgx.Tx, o Query) ([]outbox.Event, error) {
	rows, err := tx.Query(ctx, fmt.Sprintf("FETCH FORWARD %d FROM outboxd_backfill", o.Batch))
	if err != nil {
		return nil, fmt.Errorf("indexer: backfill: source_sql: %w", err)
	}
	defer rows.Close()
	b := Batch{Events: make([]outbox.Event, 0, o.Batch)}
	for rows.Next() {
		var row cursorRow
		if err := scanRow(rows, &row); err != nil {
			return nil, fmt.Errorf("indexer: backfill: source_sql: row after %q: %w", b.Last, err)
		}
		if b.add(&row, o.Index); len(b.Rejected) > 0 {
			return nil, fmt.Errorf("indexer: backfill: source_sql: row %q: %s", b.Rejected[0].ID, b.Rejected[0].Reason)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("indexer: backfill: source_sql: %w", err)
	}
	return b.Events, nil
}

// scanRow reads the cursor's current row into r.
func scanRow(rows pgx.Rows, r *cursorRow) error {
	r.hasDeleted = len(rows.FieldDescriptions()) == 4
	if r.hasDeleted {
		return rows.Scan(&r.id, &r.version, &r.document, &r.deleted)
	}
	return rows.Scan(&r.id, &r.version, &r.document)
}

// cursorRow is one row of the cursor as it was read: the id and version
// as text, so that a NULL, a fractional or a non-numeric value is that
// row's rejection rather than a scan error that stops the whole backfill.
type cursorRow struct {
	id, version pgtype.Text
	document    []byte
	deleted     pgtype.Bool
	hasDeleted  bool
}

// size is what the row weighs in a batch.
func (r *cursorRow) size() int { return len(r.id.String) + len(r.document) }

// event fills e from the row, or returns why the row cannot be written,
// naming the column. Every check of a row before it goes to the sink is
// here; the sink then checks it as it checks any event.
func (r *cursorRow) event(e *outbox.Event) (reject string) {
	e.SourceID, e.Op, e.Document = r.id.String, outbox.OpUpsert, r.document
	if !r.id.Valid {
		return "id: NULL; want the row's key"
	}
	if !r.version.Valid {
		return "version: NULL; want an integer >= 1"
	}
	v, err := parseVersion(r.version.String)
	if err != nil {
		return "version: " + err.Error()
	}
	e.Version = v
	if r.hasDeleted {
		if !r.deleted.Valid {
			return "deleted: NULL; want true or false"
		}
		if r.deleted.Bool {
			e.Op, e.Document = outbox.OpDelete, nil
		}
	}
	return ""
}

// parseVersion reads the text of a version column of any type: an
// integer, or a numeric whose fraction is zero (2.00).
func parseVersion(s string) (int64, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err == nil {
		return v, nil
	}
	if whole, frac, ok := strings.Cut(s, "."); ok && strings.Trim(frac, "0") == "" {
		if v, err := strconv.ParseInt(whole, 10, 64); err == nil {
			return v, nil
		}
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f != math.Trunc(f) {
			return 0, fmt.Errorf("%s is not a whole number", s)
		}
		return 0, fmt.Errorf("%s is out of the bigint range", s)
	}
	return 0, fmt.Errorf("%q is not an integer", s)
}
