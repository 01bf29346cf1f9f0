package documents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// DefaultReadTimeout is the statement timeout of a definition's query
// when the relay or a backfill reads documents.
const DefaultReadTimeout = 30 * time.Second

// Reader reads documents from the definitions of one outbox schema.
type Reader struct {
	pool    *pgxpool.Pool
	id      string // quoted schema
	lock    string // the advisory lock key of this schema's reads, as SQL arguments
	timeout time.Duration
}

// NewReader returns a Reader; timeout is each read's statement timeout
// (DefaultReadTimeout when 0).
func NewReader(pool *pgxpool.Pool, schemaName string, timeout time.Duration) (*Reader, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = DefaultReadTimeout
	}
	// ValidateName refuses quotes in schema names, so the literal is safe.
	return &Reader{pool: pool, id: id, lock: "hashtext('outboxd.documents'), hashtext('" + schemaName + "')", timeout: timeout}, nil
}

// Result is one read: the documents the definition returned for the ids
// asked, all from one snapshot, and the version that orders this read
// after every read that took its snapshot before it.
type Result struct {
	Version int64
	Docs    map[string]json.RawMessage // by source_id; ids not asked for are left out
	// Refused are ids the definition answered wrongly (several rows, a
	// NULL document), with the reason: they are neither written nor
	// deleted.
	Refused map[string]string
	// Expanded holds, by position of the fan-outs given to Read, the ids
	// each key query returned (all of them read too); nil when the watch
	// is gone.
	Expanded [][]string
}

// Fanout is a changed row of a table watched with a query key, as
// refresh_watched recorded it: the key query runs in the read's snapshot
// with $1 this row.
type Fanout struct {
	Table uint32 // the table's oid
	Row   string // the row's text form
}

// ReadError is a read that failed: Transient when the same read may well
// succeed later (a lost connection, a timeout, a serialization failure),
// otherwise the definition itself fails (a dropped column, a data
// error) or the index has no definition (ErrNotDefined).
type ReadError struct {
	Index     string
	Transient bool
	Outage    bool // PostgreSQL could not be reached at all
	Err       error
}

func (e *ReadError) Error() string {
	return "documents: reading index " + e.Index + ": " + e.Err.Error()
}
func (e *ReadError) Unwrap() error { return e.Err }

// Read loads the current documents of ids from index's definition in one
// query, inside a REPEATABLE READ transaction whose snapshot and version
// are taken under the schema's read lock (see the package doc for why the
// versions follow the snapshots). The query runs READ ONLY with the
// Reader's statement timeout.
//
// Each fan-out is resolved first, in the same snapshot, by its watch's key
// query, and the ids it returns are read with the others.
func (r *Reader) Read(ctx context.Context, index string, ids []string, fanouts ...Fanout) (*Result, error) {
	fail := func(err error) (*Result, error) {
		re := &ReadError{Index: index, Err: err}
		var pgErr *pgconn.PgError
		switch {
		case errors.Is(err, ErrNotDefined):
		case errors.As(err, &pgErr):
			re.Transient = transientSQLState(pgErr.Code)
		case ctx.Err() != nil:
			re.Transient = true
		default:
			// No answer from PostgreSQL: a connection refused or lost.
			re.Transient, re.Outage = true, true
		}
		return nil, re
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout+30*time.Second)
	defer cancel()
	c, err := r.pool.Acquire(ctx)
	if err != nil {
		return fail(err)
	}
	clean := false
	defer func() {
		if !clean {
			// The session may still hold the lock or the transaction:
			// closing it ends both, and the pool drops it.
			_ = c.Conn().Close(context.Background())
		}
		c.Release()
	}()
	// The lock is taken before BEGIN, so that the snapshot (taken by the
	// transaction's first query, below) is taken while it is held. Two
	// round trips: statements sent together run in one transaction.
	if _, err := c.Exec(ctx, `SELECT pg_advisory_lock(`+r.lock+`)`); err != nil {
		return fail(err)
	}
	if _, err := c.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err != nil {
		return fail(err)
	}
	res := &Result{Docs: make(map[string]json.RawMessage, len(ids))}
	var sql *string
	if err := c.QueryRow(ctx, `SELECT setval('`+r.seq()+`', greatest(nextval('`+r.seq()+`'), (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)),
		(SELECT d.sql FROM `+r.id+`.documents d WHERE d.index_name = $1)`, index).Scan(&res.Version, &sql); err != nil {
		return fail(err)
	}
	if _, err := c.Exec(ctx, fmt.Sprintf(`SELECT pg_advisory_unlock(%s); SET TRANSACTION READ ONLY; SET LOCAL statement_timeout = %d`,
		r.lock, max(1, r.timeout.Milliseconds()))); err != nil {
		return fail(err)
	}
	if sql == nil {
		return fail(ErrNotDefined)
	}
	if len(fanouts) > 0 {
		more, err := r.expand(ctx, c, index, fanouts)
		if err != nil {
			return fail(err)
		}
		res.Expanded = more
		seen := make(map[string]bool, len(ids))
		for _, id := range ids {
			seen[id] = true
		}
		ids = slices.Clip(ids)
		for _, m := range more {
			for _, id := range m {
				if !seen[id] {
					seen[id] = true
					ids = append(ids, id)
				}
			}
		}
	}
	rows, err := c.Query(ctx, *sql, ids)
	if err != nil {
		return fail(err)
	}
	asked := make(map[string]bool, len(ids))
	for _, id := range ids {
		asked[id] = true
	}
	for rows.Next() {
		var id *string
		var doc []byte
		if err := rows.Scan(&id, &doc); err != nil {
			rows.Close()
			return fail(err)
		}
		switch {
		case id == nil || !asked[*id]:
			continue
		case res.Refused[*id] != "":
			continue
		case doc == nil:
			res.refuse(*id, "the definition returned a NULL document for it (return no row for a document that does not exist)")
		case res.Docs[*id] != nil:
			res.refuse(*id, "the definition returned several rows for it")
		default:
			res.Docs[*id] = json.RawMessage(doc)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	if _, err := c.Exec(ctx, `COMMIT`); err != nil {
		return fail(err)
	}
	clean = true
	return res, nil
}

// expand runs the key query of each fan-out's watch, in one round trip.
func (r *Reader) expand(ctx context.Context, c *pgxpool.Conn, index string, fanouts []Fanout) ([][]string, error) {
	type watch struct {
		rowType uint32
		keySQL  string
	}
	watches := map[uint32]watch{}
	rows, err := c.Query(ctx, `SELECT w.tbl::oid, c.reltype, w.key_sql FROM `+r.id+`.document_watches w
		JOIN pg_class c ON c.oid = w.tbl WHERE w.index_name = $1`, index)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var oid uint32
		var w watch
		if err := rows.Scan(&oid, &w.rowType, &w.keySQL); err != nil {
			rows.Close()
			return nil, err
		}
		watches[oid] = w
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([][]string, len(fanouts))
	var batch pgconn.Batch
	var at []int
	for i, f := range fanouts {
		w, ok := watches[f.Table]
		if !ok {
			continue
		}
		// The row goes as text, typed as the table's row: record_in
		// parses what OLD::text wrote.
		batch.ExecParams(`SELECT k::text FROM (`+w.keySQL+`) AS q(k) WHERE k IS NOT NULL`,
			[][]byte{[]byte(f.Row)}, []uint32{w.rowType}, []int16{0}, []int16{0})
		at = append(at, i)
	}
	if len(at) == 0 {
		return out, nil
	}
	results, err := c.Conn().PgConn().ExecBatch(ctx, &batch).ReadAll()
	if err != nil {
		return nil, err
	}
	for j, res := range results {
		if res.Err != nil {
			return nil, res.Err
		}
		ids := make([]string, 0, len(res.Rows))
		for _, row := range res.Rows {
			ids = append(ids, string(row[0]))
		}
		out[at[j]] = ids
	}
	return out, nil
}

func (r *Reader) seq() string {
	// A regclass literal: the quoted schema inside a string literal, its
	// double quotes kept (no single quote can occur in it).
	return strings.ReplaceAll(r.id, `'`, `''`) + `.document_reads`
}

func (res *Result) refuse(id, reason string) {
	delete(res.Docs, id)
	if res.Refused == nil {
		res.Refused = make(map[string]string)
	}
	res.Refused[id] = reason
}

// transientSQLState reports whether an error with this SQLSTATE says
// nothing about the definition: connection exceptions (08), serialization
// failures and deadlocks (40), insufficient resources (53), operator
// intervention such as an admin shutdown or a statement timeout (57),
// system errors (58), a lock not available (55P03) and a cached plan whose
// result changed under it (0A000 after DDL; the next read prepares anew).
func transientSQLState(code string) bool {
	switch {
	case code == "55P03", code == "0A000":
		return true
	case len(code) == 5:
		return strings.Contains(" 08 40 53 57 58 ", " "+code[:2]+" ")
	}
	return false
}
