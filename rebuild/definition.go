package rebuild

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/source"
)

// lookup finds, with from=source, the index's definition and refuses what
// cannot be copied: a definition-fed index with a SourceSQL (its
// documents come from its definition, at read versions), one without
// either, or a definition without an ids query.
func (o *Options) lookup(ctx context.Context) error {
	if o.From != "source" {
		return nil
	}
	def, err := documents.Lookup(ctx, o.Pool, o.Schema, o.Index)
	if err != nil {
		return fmt.Errorf("indexer: rebuild: %w", err)
	}
	switch given := strings.TrimSpace(o.SourceSQL) != ""; {
	case def == nil && !given:
		return fmt.Errorf("indexer: rebuild: source_sql: required with from=source: index %s has no document definition to fill the new index from (outboxd documents define --index %s)", o.Index, o.Index)
	case def != nil && given:
		return fmt.Errorf("indexer: rebuild: source_sql: index %s is definition-fed: with from=source the new index is filled from its definition; leave source_sql out", o.Index)
	case def != nil:
		if err := def.NeedIDs(); err != nil {
			return fmt.Errorf("indexer: rebuild: %w", err)
		}
	}
	o.def = def
	return nil
}

// copyDefinition fills the new index from the index's definition: the ids
// of its ids query, read in batches by documents.Reader, each document
// copied at the version of its read (an id the definition no longer
// returns as a tombstone at it). Those versions order the copies with the
// relay's reads, which keep writing to the old index and are caught up
// from it: whichever read took the later snapshot wins in the new index.
// It returns how many ids there were.
func (r *runner) copyDefinition(ctx context.Context, w *copyWriter, tombstones int64) (int64, error) {
	reader, err := documents.NewReader(r.o.Pool, r.o.Schema, r.o.SourceTimeout)
	if err != nil {
		return 0, fmt.Errorf("indexer: rebuild: %w", err)
	}
	conn, err := r.o.Pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("indexer: rebuild: %w", err)
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, fmt.Errorf("indexer: rebuild: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := source.DeclareIDs(ctx, tx, r.o.def.IDsSQL, r.o.SourceTimeout, ""); err != nil {
		return 0, fmt.Errorf("indexer: rebuild %s: %w", r.o.Index, err)
	}
	total := source.Estimate(ctx, tx, r.o.def.IDsSQL) + tombstones
	r.o.Progress.SetTotal(total)
	_ = r.st.setTotal(ctx, total)
	rd := source.NewDefinition(tx, reader, source.Query{Index: r.o.Index, Batch: r.o.Batch})
	deletedAt := time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
	var rows int64
	for {
		b, err := rd.Next(ctx)
		if err != nil {
			return rows, fmt.Errorf("indexer: rebuild %s: %w", r.o.Index, err)
		}
		if b.Rows == 0 {
			return rows, nil
		}
		rows += int64(b.Rows)
		for _, rj := range b.Rejected {
			w.reject(rj.ID, rj.Reason)
		}
		for _, e := range b.Events {
			d, reason := indexer.CopyItemOf(e, deletedAt)
			if reason != "" {
				w.reject(e.SourceID, reason)
				continue
			}
			if err := w.add(d); err != nil {
				return rows, err
			}
		}
	}
}
