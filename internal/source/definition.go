package source

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/outbox"
)

// DeclareIDs opens the cursor over idsSQL (one column, the source ids)
// after key after, ordered by the id in its own type as Declare orders a
// source query, so that an ids query over a table's key reads its index
// in order and resumes with an index condition.
func DeclareIDs(ctx context.Context, tx pgx.Tx, idsSQL string, timeout time.Duration, after string) error {
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true), set_config('outboxd.backfill_after', $2, true)`,
		fmt.Sprint(timeout.Milliseconds()), after); err != nil {
		return fmt.Errorf("documents: ids_sql: %w", err)
	}
	sd, err := tx.Conn().PgConn().Prepare(ctx, "", idsSQL, nil)
	if err != nil {
		return fmt.Errorf("documents: ids_sql: %w", err)
	}
	if len(sd.Fields) != 1 {
		return fmt.Errorf("documents: ids_sql: returns %d columns; want one, the source id", len(sd.Fields))
	}
	var keyType string
	if err := tx.QueryRow(ctx, `SELECT format_type($1, nullif($2::int, -1))`, sd.Fields[0].DataTypeOID, sd.Fields[0].TypeModifier).Scan(&keyType); err != nil {
		return fmt.Errorf("documents: ids_sql: %w", err)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("documents: ids_sql: %w", err)
	}
	_, err = sp.Exec(ctx, CursorSQL(idsSQL, keyType, 1, after != ""))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42883" || pe.Code == "42846") {
		if err := sp.Rollback(ctx); err != nil {
			return fmt.Errorf("documents: ids_sql: %w", err)
		}
		_, err = tx.Exec(ctx, CursorSQL(idsSQL, "", 1, after != ""))
	} else if err == nil {
		err = sp.Commit(ctx)
	}
	if err != nil {
		return fmt.Errorf("documents: ids_sql: %w", err)
	}
	return nil
}

// Definition reads a definition-fed index whole, as batches of events:
// the ids of the cursor DeclareIDs opened, each batch's documents read by
// documents.Reader.Read. Every read takes its own snapshot and version
// under the lock that orders all reads of the outbox schema, the relay's
// included (see package documents): a document read here loses the
// version gate to a refresh the relay read after it, and wins over one
// read before it, whatever order the writes then reach Elasticsearch in.
// An id the definition no longer returns becomes a delete at the read's
// version (a tombstone), so a document deleted after the ids were listed
// stays deleted.
//
// A batch holds at most Batch ids and, as far as the documents of the
// previous read tell, BatchBytes bytes: the first read asks for
// firstFetch ids, each later one for as many as the largest document of
// the one before says fit in what the batch has left.
type Definition struct {
	tx      pgx.Tx
	reader  *documents.Reader
	o       Query
	largest int
	done    bool
	// Reads counts the definition's queries; Retried the transient
	// failures read again.
	Reads, Retried int
}

// NewDefinition reads the cursor DeclareIDs opened on tx in batches of o
// (1000 ids and 8 MiB when not set), through reader. tx may be nil for
// Read alone.
func NewDefinition(tx pgx.Tx, reader *documents.Reader, o Query) *Definition {
	if o.Batch <= 0 {
		o.Batch = 1000
	}
	if o.BatchBytes <= 0 {
		o.BatchBytes = 8 << 20
	}
	return &Definition{tx: tx, reader: reader, o: o}
}

// Next returns the next batch; Rows is 0 at the end.
func (d *Definition) Next(ctx context.Context) (Batch, error) {
	b := Batch{Events: make([]outbox.Event, 0, min(d.o.Batch, 1024))}
	for !d.done && b.Rows < d.o.Batch && (b.Rows == 0 || b.Bytes < d.o.BatchBytes) {
		n := min(d.o.Batch-b.Rows, firstFetch)
		if d.largest > 0 {
			n = min(d.o.Batch-b.Rows, max(1, (d.o.BatchBytes-b.Bytes)/d.largest))
		}
		ids, rows, err := d.fetch(ctx, n, &b)
		if err != nil {
			return Batch{}, err
		}
		d.done = rows < n
		if len(ids) == 0 {
			continue
		}
		if err := d.add(ctx, ids, &b); err != nil {
			return Batch{}, err
		}
	}
	return b, nil
}

// Read reads the documents of ids as events, as Next does for the ids of
// the cursor: for reconcile, which also reads ids its ids query did not
// list. Rows counts only the ids listed in the cursor, so it is 0 here.
func (d *Definition) Read(ctx context.Context, ids []string) (Batch, error) {
	var b Batch
	err := d.add(ctx, ids, &b)
	return b, err
}

// add reads ids from the definition and appends their events to b: an
// upsert of each document returned, a delete for each id it no longer
// returns, both at the read's version; an id it answered wrongly is
// rejected.
func (d *Definition) add(ctx context.Context, ids []string, b *Batch) error {
	res, err := d.read(ctx, ids)
	if err != nil {
		return err
	}
	d.largest = 0
	for _, id := range ids {
		e := outbox.Event{IndexName: d.o.Index, SourceID: id, Version: res.Version, Op: outbox.OpDelete}
		if reason, ok := res.Refused[id]; ok {
			b.Rejected = append(b.Rejected, Reject{ID: id, Reason: reason})
			continue
		}
		if doc, ok := res.Docs[id]; ok {
			e.Op, e.Document = outbox.OpUpsert, doc
			d.largest = max(d.largest, len(id)+len(doc))
			b.Bytes += len(doc)
		}
		b.Bytes += len(id)
		b.Events = append(b.Events, e)
	}
	return nil
}

// fetch reads the next n rows of the ids cursor: the distinct non-NULL
// ids, and how many rows there were.
func (d *Definition) fetch(ctx context.Context, n int, b *Batch) ([]string, int, error) {
	rows, err := d.tx.Query(ctx, fmt.Sprintf("FETCH FORWARD %d FROM outboxd_backfill", n))
	if err != nil {
		return nil, 0, fmt.Errorf("documents: ids_sql: %w", err)
	}
	defer rows.Close()
	var ids []string
	seen := map[string]bool{}
	count := 0
	for rows.Next() {
		var id *string
		if err := rows.Scan(&id); err != nil {
			return nil, 0, fmt.Errorf("documents: ids_sql: row after %q: %w", b.Last, err)
		}
		count++
		b.Rows++
		if id == nil {
			b.Rejected = append(b.Rejected, Reject{Reason: "ids_sql: returned a NULL id"})
			continue
		}
		b.Last = *id
		if !seen[*id] {
			seen[*id] = true
			ids = append(ids, *id)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("documents: ids_sql: %w", err)
	}
	return ids, count, nil
}

// read reads ids from the definition, again after a failure that says
// nothing about it (a lost connection, a serialization failure), up to 5
// times.
func (d *Definition) read(ctx context.Context, ids []string) (*documents.Result, error) {
	delay := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		d.Reads++
		res, err := d.reader.Read(ctx, d.o.Index, ids)
		var re *documents.ReadError
		if err == nil || ctx.Err() != nil || !errors.As(err, &re) || !re.Transient || attempt == 5 {
			return res, err
		}
		d.Retried++
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		delay *= 2
	}
}

// Close is for symmetry with Reader: the cursor lives in the caller's
// transaction.
func (d *Definition) Close() {}

// DefinitionHash is what a tool's progress row keeps as its source's
// hash for a definition, so that a run is continued only with the same
// definition and ids query.
func DefinitionHash(def *documents.Definition) string {
	return "definition\x00" + def.SQL + "\x00" + def.IDsSQL
}
