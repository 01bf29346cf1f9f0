package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/outbox"
)

// source walks SourceSQL, in a read-only transaction with a statement
// timeout, and notes (and queues fixes for) every row that drifted.
func (f *reconFixer) source(ctx context.Context, states map[string]reconState, writeIndex string) error {
	src, err := f.opts.DB.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("indexer: reconcile: source_sql: begin: %w", err)
	}
	defer src.Rollback(context.WithoutCancel(ctx))
	if _, err := src.Exec(ctx, `SELECT set_config('statement_timeout', $1, true)`, strconv.FormatInt(f.opts.SourceTimeout.Milliseconds(), 10)); err != nil {
		return fmt.Errorf("indexer: reconcile: source_sql: set statement_timeout: %w", err)
	}
	var ahead []aheadRow
	rows, err := src.Query(ctx, f.opts.SourceSQL)
	if err != nil {
		return sourceError(ctx, err, f.opts.SourceTimeout)
	}
	defer rows.Close()
	cols := len(rows.FieldDescriptions())
	if cols != 3 && cols != 4 {
		// pgx reports a failed statement on Close, not on Query: the
		// guard's refusals arrive here with no columns.
		rows.Close()
		if err := rows.Err(); err != nil {
			return sourceError(ctx, err, f.opts.SourceTimeout)
		}
		return fmt.Errorf("indexer: reconcile: source_sql: returns %d columns; want source_id, version, document[, deleted]", cols)
	}
	for rows.Next() {
		var (
			sid     string
			ver     *int64
			doc     []byte
			deleted *bool
		)
		dest := []any{&sid, &ver, &doc}
		if cols == 4 {
			dest = append(dest, &deleted)
		}
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("indexer: reconcile: source_sql row %d: %w", f.rep.SourceRows+1, err)
		}
		f.rep.SourceRows++
		if ver == nil {
			return fmt.Errorf("indexer: reconcile: source_sql row %d (source_id %q): version: is NULL", f.rep.SourceRows, sid)
		}
		v := *ver
		st, inIndex := states[sid]
		if inIndex {
			st.seen = true
			states[sid] = st
		}
		gone := doc == nil || string(doc) == "null" || (deleted != nil && *deleted)
		if gone {
			if st.live > 0 {
				if st.liveOff > 0 {
					f.note(DriftResurrected, sid, v, st, "needs repair: a visible copy is not at _id = source_id")
					f.rep.NeedsRepair++
				} else {
					at := max(v, st.canonVersion+1)
					f.note(DriftResurrected, sid, v, st, fmt.Sprintf("delete at version %d", at))
					if err := f.add(ctx, outbox.Event{IndexName: f.opts.Index, SourceID: sid, Version: at, Op: outbox.OpDelete}); err != nil {
						return err
					}
				}
			}
			continue
		}
		if st.live > 1 {
			f.note(DriftDuplicate, sid, v, st, "needs repair: several live documents for this source_id (merge them by the key source_id)")
		}
		var kind string
		switch {
		case st.live == 0:
			kind = DriftMissing
		case st.maxLive < v:
			kind = DriftStale
		case st.maxLive > v:
			if st.liveOff > 0 {
				f.note(DriftAhead, sid, v, st, "needs repair: a visible copy is not at _id = source_id")
				f.rep.NeedsRepair++
				continue
			}
			ahead = append(ahead, aheadRow{sid: sid, v: v, doc: doc, st: st})
			if len(ahead) >= f.opts.Batch {
				if err := f.ahead(ctx, writeIndex, ahead); err != nil {
					return err
				}
				ahead = ahead[:0]
			}
			continue
		default:
			continue
		}
		if st.liveOff > 0 {
			f.note(kind, sid, v, st, "needs repair: a visible copy is not at _id = source_id")
			f.rep.NeedsRepair++
			continue
		}
		at := max(v, st.canonVersion)
		f.note(kind, sid, v, st, fmt.Sprintf("upsert at version %d", at))
		if err := f.add(ctx, outbox.Event{IndexName: f.opts.Index, SourceID: sid, Version: at, Op: outbox.OpUpsert, Document: json.RawMessage(doc)}); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return sourceError(ctx, err, f.opts.SourceTimeout)
	}
	rows.Close()
	if err := f.ahead(ctx, writeIndex, ahead); err != nil {
		return err
	}

	return nil
}

// sourceError names the two ways the guard around SourceSQL refuses it.
func sourceError(ctx context.Context, err error, timeout time.Duration) error {
	var pgErr *pgconn.PgError
	// A canceled ctx also ends the statement with query_canceled.
	if ctx.Err() == nil && errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "25006": // read_only_sql_transaction
			return fmt.Errorf("indexer: reconcile: source_sql: must only read; it runs in a READ ONLY transaction: %w", err)
		case "57014": // query_canceled: statement_timeout
			return fmt.Errorf("indexer: reconcile: source_sql: did not finish within the source timeout of %s (statement_timeout): %w", timeout, err)
		}
	}
	return fmt.Errorf("indexer: reconcile: source_sql: %w", err)
}
