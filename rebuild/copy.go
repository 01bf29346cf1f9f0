package rebuild

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/elastic/go-elasticsearch/v8/esapi"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/scan"
	"github.com/outboxd/outboxd/internal/source"
)

// createIndex creates the new index, with the current index's mappings
// and settings where none were given. Already existing (a killed run made
// it) is fine: the row says it is ours.
func (r *runner) createIndex(ctx context.Context) error {
	if err := r.st.check(ctx); err != nil {
		return err
	}
	body, err := newIndexBody(ctx, r.o.ES, r.cur.Old, r.o.Mappings, r.o.Settings)
	if err != nil {
		return err
	}
	_, err = indexer.Perform(ctx, r.o.ES, "create index "+r.cur.New, esapi.IndicesCreateRequest{Index: r.cur.New, Body: bytes.NewReader(body)})
	var re *indexer.ResponseError
	if errors.As(err, &re) && re.Type == "resource_already_exists_exception" {
		return nil
	}
	if errors.As(err, &re) && re.Status == 400 {
		return fmt.Errorf("indexer: rebuild %s: Elasticsearch refused the new mappings or settings: %w", r.o.Index, err)
	}
	return err
}

// copyAll fills the new index from the old one or from the source, then
// moves to catching_up. An interrupted copy starts over: the PIT it read
// is gone, and copying a document twice is harmless.
func (r *runner) copyAll(ctx context.Context, rep *Report) error {
	if err := r.createIndex(ctx); err != nil {
		return err
	}
	if err := r.st.resetCopy(ctx); err != nil {
		return err
	}
	// The copy starts over, so checkpoints read now are as good as the
	// first ones and leave less to catch up.
	cps, err := shardCheckpoints(ctx, r.o.ES, r.cur.Old)
	if err != nil {
		return err
	}
	if err := r.st.setCheckpoints(ctx, cps); err != nil {
		return err
	}
	r.cur.Checkpoints = cps
	r.cur.Rejected, r.cur.Samples = 0, nil
	old := []string{r.cur.Old}
	total, err := scan.Count(ctx, r.o.ES, old)
	if err != nil {
		return err
	}
	tombstones := json.RawMessage(`{"term":{"outboxd_deleted":true}}`)
	w := r.newWriter(ctx, true)
	if r.o.From == "source" {
		if total, err = scan.CountQuery(ctx, r.o.ES, r.cur.Old, tombstones); err != nil {
			return err
		}
		// Opened after the checkpoints: anything the snapshot misses was
		// written to the old index after them and is caught up.
		copySource := r.copySource
		if r.o.def != nil {
			copySource = r.copyDefinition
		}
		rows, err := copySource(ctx, w, total)
		if err != nil {
			return w.abandon(err)
		}
		total += rows
	} else {
		r.o.Progress.SetTotal(total)
		_ = r.st.setTotal(ctx, total)
	}
	opts := scan.Options{Indices: old, PageSize: r.o.Batch, Refresh: true}
	if r.o.From == "source" {
		opts.Query = tombstones
	}
	err = scan.Each(ctx, r.o.ES, opts, func(h scan.Hit) error {
		return w.add(indexer.CopyItem{ID: h.ID, Version: h.Version, Source: bytes.Clone(h.Source)})
	})
	if err != nil {
		return w.abandon(err)
	}
	n, err := w.close()
	rep.Copied += n
	if err != nil {
		return err
	}
	_ = r.st.setTotal(ctx, max(total, n))
	r.cur.Phase = PhaseCatchingUp
	return r.st.setPhase(ctx, PhaseCatchingUp)
}

// copySource streams the rows of SourceSQL, in a read-only snapshot, to
// the writer and returns how many there were.
func (r *runner) copySource(ctx context.Context, w *copyWriter, tombstones int64) (int64, error) {
	bo := source.Query{Index: r.o.Index, SourceSQL: r.o.SourceSQL, Batch: r.o.Batch, SourceTimeout: r.o.SourceTimeout}
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
	if err := source.Declare(ctx, tx, bo, ""); err != nil {
		return 0, err
	}
	total := source.Estimate(ctx, tx, r.o.SourceSQL) + tombstones
	r.o.Progress.SetTotal(total)
	_ = r.st.setTotal(ctx, total)
	deletedAt := time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
	var rows int64
	for {
		events, err := source.Fetch(ctx, tx, bo)
		if err != nil || len(events) == 0 {
			return rows, err
		}
		rows += int64(len(events))
		for _, e := range events {
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
