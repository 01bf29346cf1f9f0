package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/elastic/go-elasticsearch/v8/esapi"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/source"
	"github.com/outboxd/outboxd/outbox"
)

// defBatch is how many ids one read of the definition (and one mget)
// takes.
const defBatch = 1000

// definition compares the index with its definition, the truth of a
// definition-fed index: every id of the ids query, and then every id the
// index holds a live copy of that the ids query did not list, is read
// from the definition in batches (each batch in a snapshot and at a
// version of its own, as the relay reads) and compared with the document
// at _id = source_id in the write index, fetched after the read:
//
//   - missing: the definition returns a document, the index has no live
//     copy;
//   - stale: the index's copy has other content and a version below the
//     read's;
//   - extra: the definition returns nothing, the index shows a live copy
//     at a version below the read's.
//
// A copy at a version above the read's was written from a later read
// (the relay delivered a change meanwhile) and is not drift. Each drift
// is fixed by a refresh of its id: the relay reads it again, at a version
// above every earlier read, so the fix wins the gate over the copy it
// replaces and loses to nothing newer.
func (f *reconFixer) definition(ctx context.Context, states map[string]reconState, writeIndex string) error {
	reader, err := documents.NewReader(f.opts.DB, f.opts.Schema, f.opts.SourceTimeout)
	if err != nil {
		return fmt.Errorf("indexer: reconcile: %w", err)
	}
	tx, err := f.opts.DB.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("indexer: reconcile: ids_sql: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := source.DeclareIDs(ctx, tx, f.opts.def.IDsSQL, f.opts.SourceTimeout, ""); err != nil {
		return fmt.Errorf("indexer: reconcile: index %s: %w", f.opts.Index, err)
	}
	rd := source.NewDefinition(tx, reader, source.Query{Index: f.opts.Index, Batch: defBatch})
	for {
		b, err := rd.Next(ctx)
		if err != nil {
			return fmt.Errorf("indexer: reconcile: index %s: %w", f.opts.Index, err)
		}
		if b.Rows == 0 {
			break
		}
		if err := f.compare(ctx, b, states, writeIndex); err != nil {
			return err
		}
	}
	// What the index shows and the ids query did not list: the
	// definition may still return it (an id added since the listing).
	var rest []string
	for sid, st := range states {
		if !st.seen && st.live > 0 {
			rest = append(rest, sid)
		}
	}
	sort.Strings(rest)
	for len(rest) > 0 {
		n := min(len(rest), defBatch)
		b, err := rd.Read(ctx, rest[:n])
		if err != nil {
			return fmt.Errorf("indexer: reconcile: index %s: %w", f.opts.Index, err)
		}
		if err := f.compare(ctx, b, states, writeIndex); err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}

// compare notes the drift of one batch of the definition's documents
// (upserts of what it returned, deletes for the ids it did not) against
// the write index, and queues a refresh for each.
func (f *reconFixer) compare(ctx context.Context, b source.Batch, states map[string]reconState, writeIndex string) error {
	f.rep.Rejected = append(f.rep.Rejected, b.Rejected...)
	if len(b.Events) == 0 {
		return nil
	}
	ids := make([]string, len(b.Events))
	for i, e := range b.Events {
		ids[i] = e.SourceID
	}
	got, err := mgetCopies(ctx, f.opts, writeIndex, ids)
	if err != nil {
		return err
	}
	for i, e := range b.Events {
		sid, c := e.SourceID, got[i]
		st := states[sid]
		if _, ok := states[sid]; ok {
			st.seen = true
			states[sid] = st
		}
		st.maxLive = c.version // the samples show the copy compared with
		live := c.found && !c.tombstone
		newer := c.found && c.version > e.Version
		var kind string
		switch {
		case e.Op == outbox.OpUpsert:
			f.rep.SourceRows++
			if st.live > 1 {
				f.note(DriftDuplicate, sid, e.Version, st, "needs repair: several live documents for this source_id (merge them by the key source_id)")
			}
			switch {
			case live && indexer.JSONEqual(e.Document, c.source), newer:
				continue
			case !live:
				kind = DriftMissing
			default:
				kind = DriftStale
			}
		case live && !newer, st.liveOff > 0:
			kind = DriftExtra
		default:
			continue
		}
		if st.liveOff > 0 {
			f.note(kind, sid, e.Version, st, "needs repair: a visible copy is not at _id = source_id")
			f.rep.NeedsRepair++
			continue
		}
		f.note(kind, sid, e.Version, st, "refresh: the relay reads it again from the definition")
		if err := f.add(ctx, outbox.Event{IndexName: f.opts.Index, SourceID: sid, Version: 1, Op: outbox.OpRefresh}); err != nil {
			return err
		}
	}
	return nil
}

// indexCopy is the document at _id = source_id in the write index.
type indexCopy struct {
	found, tombstone bool
	version          int64
	source           json.RawMessage
}

// mgetCopies reads the documents of ids from the write index, in order.
func mgetCopies(ctx context.Context, opts Options, writeIndex string, ids []string) ([]indexCopy, error) {
	body, _ := json.Marshal(map[string]any{"ids": ids})
	raw, err := indexer.Perform(ctx, opts.ES, "mget", esapi.MgetRequest{
		Index: writeIndex, Body: bytes.NewReader(body), Realtime: esapi.BoolPtr(true),
		FilterPath: []string{"docs.found", "docs._version", "docs._source"},
	})
	if err != nil {
		return nil, fmt.Errorf("indexer: reconcile: reading the index's documents: %w", err)
	}
	var r struct {
		Docs []struct {
			Found   bool            `json:"found"`
			Version int64           `json:"_version"`
			Source  json.RawMessage `json:"_source"`
		} `json:"docs"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || len(r.Docs) != len(ids) {
		return nil, fmt.Errorf("indexer: reconcile: reading the index's documents: the mget answer does not list every id")
	}
	out := make([]indexCopy, len(ids))
	for i, d := range r.Docs {
		var tomb struct {
			Deleted bool `json:"outboxd_deleted"`
		}
		_ = json.Unmarshal(d.Source, &tomb)
		out[i] = indexCopy{found: d.Found, tombstone: tomb.Deleted, version: d.Version, source: d.Source}
	}
	return out, nil
}
