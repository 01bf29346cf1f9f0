package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/elastic/go-elasticsearch/v8/esapi"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/source"
	"github.com/outboxd/outboxd/outbox"
)

// aheadRow is a source row the index holds at a higher version; whether
// that is drift depends on the indexed content.
type aheadRow struct {
	sid string
	v   int64
	doc []byte
	st  reconState
}

// ahead reads the indexed documents of rows and turns those whose content
// differs from the source into fixes (see Run).
func (f *reconFixer) ahead(ctx context.Context, writeIndex string, rows []aheadRow) error {
	if len(rows) == 0 {
		return nil
	}
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.sid
	}
	body, _ := json.Marshal(map[string]any{"ids": ids})
	raw, err := indexer.Perform(ctx, f.opts.ES, "mget", esapi.MgetRequest{
		Index: writeIndex, Body: bytes.NewReader(body), FilterPath: []string{"docs.found", "docs._source"},
	})
	if err != nil {
		return fmt.Errorf("indexer: reconcile: ahead documents: %w", err)
	}
	var r struct {
		Docs []struct {
			Found  bool            `json:"found"`
			Source json.RawMessage `json:"_source"`
		} `json:"docs"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || len(r.Docs) != len(rows) {
		return fmt.Errorf("indexer: reconcile: ahead documents: the mget answer does not list every id")
	}
	for i, row := range rows {
		if d := r.Docs[i]; d.Found && indexer.JSONEqual(row.doc, d.Source) {
			continue
		}
		at := max(row.st.maxLive, row.st.canonVersion) + 1
		f.note(DriftAhead, row.sid, row.v, row.st, fmt.Sprintf("upsert of the source's document at version %d", at))
		if err := f.add(ctx, outbox.Event{IndexName: f.opts.Index, SourceID: row.sid, Version: at, Op: outbox.OpUpsert, Document: json.RawMessage(row.doc)}); err != nil {
			return err
		}
	}
	return nil
}

// reconFixer batches fix events into outbox transactions (or only counts
// them on a dry run).
type reconFixer struct {
	opts    Options
	ob      *outbox.Outbox
	rep     *Report
	pending []outbox.Event
}

func (f *reconFixer) add(ctx context.Context, e outbox.Event) error {
	// The outbox would refuse the whole batch for this one row.
	if field := outbox.ReservedField(e.Document); e.Op == outbox.OpUpsert && field != "" {
		f.rep.Rejected = append(f.rep.Rejected, source.Reject{ID: e.SourceID,
			Reason: fmt.Sprintf("document: the top-level field %s is reserved (it marks a delete's tombstone in the index)", field)})
		return nil
	}
	e.EventType = "outboxd.reconcile"
	f.rep.Events++
	if !f.opts.Apply {
		return nil
	}
	f.pending = append(f.pending, e)
	if len(f.pending) >= f.opts.Batch {
		return f.flush(ctx)
	}
	return nil
}

func (f *reconFixer) flush(ctx context.Context) error {
	if len(f.pending) == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, f.opts.DB, func(tx pgx.Tx) error {
		if f.opts.def != nil {
			return f.flushRefreshes(ctx, tx)
		}
		if _, err := f.ob.AppendBatch(ctx, tx, f.pending); err != nil {
			return err
		}
		idx := make([]string, len(f.pending))
		sids := make([]string, len(f.pending))
		vers := make([]int64, len(f.pending))
		for i, e := range f.pending {
			idx[i], sids[i], vers[i] = e.IndexName, e.SourceID, e.Version
		}
		s := f.ob.Schema()
		_, err := tx.Exec(ctx, `INSERT INTO `+s+`.versions AS v (index_name, source_id, version)
			SELECT i, s, max(n) FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(i, s, n) GROUP BY i, s
			ON CONFLICT (index_name, source_id) DO UPDATE SET version = greatest(v.version, excluded.version)`, idx, sids, vers)
		if err != nil {
			return fmt.Errorf("raise versions: %w", err)
		}
		return f.audit(ctx, tx, sids)
	})
	if err != nil {
		return fmt.Errorf("indexer: reconcile: apply: %w", err)
	}
	f.pending = f.pending[:0]
	return nil
}

// flushRefreshes appends the pending fixes of a definition-fed index:
// refreshes, which the relay answers with a read above every earlier one
// (no versions counter to raise).
func (f *reconFixer) flushRefreshes(ctx context.Context, tx pgx.Tx) error {
	sids := make([]string, len(f.pending))
	for i, e := range f.pending {
		sids[i] = e.SourceID
	}
	if _, err := tx.Exec(ctx, `SELECT count(`+f.ob.Schema()+`.refresh($1, s)) FROM unnest($2::text[]) AS u(s)`, f.opts.Index, sids); err != nil {
		return err
	}
	return f.audit(ctx, tx, sids)
}

func (f *reconFixer) audit(ctx context.Context, tx pgx.Tx, sids []string) error {
	detail, _ := json.Marshal(map[string]any{"index": f.opts.Index, "events": len(f.pending), "source_ids": sids})
	_, err := tx.Exec(ctx, `INSERT INTO `+f.ob.Schema()+`.audit_log (operator, action, detail) VALUES ($1, 'reconcile.apply', $2)`, f.opts.Operator, detail)
	return err
}
