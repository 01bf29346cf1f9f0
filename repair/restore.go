package repair

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/progress"
)

// RestoreOptions configures Restore.
type RestoreOptions struct {
	Audit    *AuditLog
	Batch    int // documents per request; 0 means 500
	Progress *progress.Bar
}

// RestoreResult counts a restore.
type RestoreResult struct {
	Restored int `json:"restored"` // deleted by the repair, back at their backed-up _version
	// Raised were put back with their backed-up source at a version above
	// the backed-up one, because Elasticsearch versions cannot go down: an
	// overwritten document replaces the repair's write (its version + 1),
	// a deleted one may meet the repair's own delete, which Elasticsearch
	// remembers for index.gc_deletes (60s by default).
	Raised    int `json:"raised"`
	Removed   int `json:"removed"`   // documents the repair had created
	Untouched int `json:"untouched"` // backed up, but the repair did not write them (its apply skipped them)
	// Skipped: the repair wrote them but they, or their group's document,
	// changed since; left as they are.
	Skipped []Skip `json:"skipped,omitempty"`
}

// restoreRecords is what the backup proves the repair wrote, read in a
// first pass (coordinates only, no sources).
type restoreRecords struct {
	written map[string]BackupEntry // by group key
	kept    map[string]BackupEntry // by group key
	deleted map[docRef]BackupEntry // by document
	// changed holds, by group key, why the group's document (the rewrite
	// or the keeper left in place) is no longer what the repair left.
	changed map[string]string
}

// Restore undoes what a repair wrote, and only that. A group is
// undone only while its document at _id = source_id is exactly what the
// repair left (same _seq_no and _primary_term as the rewrite, or as the
// keeper it left in place): a later write, an update or a delete through
// the outbox, means the source moved on, and bringing back the old copies
// would overwrite it or put stale duplicates beside it. Such groups are
// skipped and reported. Otherwise:
//
//   - a document the rewrite overwrote gets its source back, conditionally
//     on the rewrite's _seq_no/_primary_term;
//   - a document the rewrite created is deleted on the same condition;
//   - a document the repair deleted is put back at its backed-up _version
//     (version_type=external_gte) if its _id is still absent; where
//     Elasticsearch still remembers the repair's own delete, at that
//     delete's version.
//
// Backed-up documents the repair did not write are left alone. A backup
// without the records of the repair's writes (written before they existed)
// is refused.
func Restore(ctx context.Context, es *elasticsearch.Client, path string, opts RestoreOptions) (*RestoreResult, error) {
	batch := opts.Batch
	if batch <= 0 {
		batch = 500
	}
	recs, err := restoreReadRecords(path)
	if err != nil {
		return nil, err
	}
	if err := recs.check(ctx, es, batch); err != nil {
		return nil, err
	}
	res := &RestoreResult{}
	var pending []BackupEntry
	err = restoreEach(path, func(e BackupEntry) error {
		if e.Kind != BackupDocument && e.Kind != BackupCreated {
			return nil
		}
		pending = append(pending, e)
		if len(pending) < batch {
			return nil
		}
		err := recs.restoreBatch(ctx, es, pending, res)
		opts.Progress.Add(int64(len(pending)))
		pending = pending[:0]
		return err
	})
	if err == nil {
		err = recs.restoreBatch(ctx, es, pending, res)
		opts.Progress.Add(int64(len(pending)))
	}
	if err != nil {
		return res, err
	}
	_ = opts.Audit.Append(AuditEntry{Action: "repair.restore", Reason: "restore from " + path, Outcome: fmt.Sprintf("restored %d, raised %d, removed %d, untouched %d, skipped %d", res.Restored, res.Raised, res.Removed, res.Untouched, len(res.Skipped)), Detail: res})
	return res, opts.Audit.Sync()
}

// restoreEach calls fn for every line after the header, checking the
// header and its format first.
func restoreEach(path string, fn func(BackupEntry) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("indexer: restore: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 512<<20)
	line := 0
	for sc.Scan() {
		line++
		var e BackupEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("indexer: restore: %s line %d: %w", path, line, err)
		}
		if line == 1 {
			if e.Kind != BackupHeader {
				return fmt.Errorf("indexer: restore: %s: not a repair backup (no header line)", path)
			}
			if e.Format != BackupFormat {
				return fmt.Errorf("indexer: restore: %s: format: %d, want %d: this backup does not record what the repair wrote, so a restore cannot tell the repair's writes from later ones; nothing was changed (put documents back by hand from its _source lines)", path, e.Format, BackupFormat)
			}
			continue
		}
		switch e.Kind {
		case BackupDocument, BackupCreated, BackupKept, BackupWritten, BackupDeleted:
		default:
			return fmt.Errorf("indexer: restore: %s line %d: kind: unknown %q", path, line, e.Kind)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("indexer: restore: %s: %w", path, err)
	}
	if line == 0 {
		return fmt.Errorf("indexer: restore: %s: not a repair backup (empty)", path)
	}
	return nil
}

func restoreReadRecords(path string) (*restoreRecords, error) {
	r := &restoreRecords{written: map[string]BackupEntry{}, kept: map[string]BackupEntry{}, deleted: map[docRef]BackupEntry{}, changed: map[string]string{}}
	err := restoreEach(path, func(e BackupEntry) error {
		switch e.Kind {
		case BackupWritten:
			r.written[e.Key] = e
		case BackupKept:
			r.kept[e.Key] = e
		case BackupDeleted:
			r.deleted[docRef{e.Index, e.ID}] = e
		}
		return nil
	})
	return r, err
}

// check compares every group's document with what the repair left.
func (r *restoreRecords) check(ctx context.Context, es *elasticsearch.Client, batch int) error {
	var keys []string
	var refs []docRef
	flush := func() error {
		got, err := mget(ctx, es, refs, false)
		if err != nil {
			return fmt.Errorf("indexer: restore: %w", err)
		}
		for i, k := range keys {
			left, what := r.written[k], "the repair's rewrite"
			if _, ok := r.written[k]; !ok {
				left, what = r.kept[k], "the keeper the repair left in place"
			}
			switch d := got[refs[i]]; {
			case !d.Found:
				r.changed[k] = fmt.Sprintf("%s/%s (%s) is gone since the repair", left.Index, left.ID, what)
			case d.SeqNo != left.SeqNo || d.PrimaryTerm != left.PrimaryTerm:
				r.changed[k] = fmt.Sprintf("%s/%s (%s at _version %d, _seq_no %d) changed since the repair: now _version %d, _seq_no %d", left.Index, left.ID, what, left.Version, left.SeqNo, d.Version, d.SeqNo)
			}
		}
		keys, refs = keys[:0], refs[:0]
		return nil
	}
	add := func(k string, e BackupEntry) error {
		keys = append(keys, k)
		refs = append(refs, docRef{e.Index, e.ID})
		if len(refs) >= batch {
			return flush()
		}
		return nil
	}
	for k, e := range r.written {
		if err := add(k, e); err != nil {
			return err
		}
	}
	for k, e := range r.kept {
		if _, rewritten := r.written[k]; !rewritten {
			if err := add(k, e); err != nil {
				return err
			}
		}
	}
	return flush()
}

// restoreStep is one conditional write of a batch and how to count it.
type restoreStep struct {
	e       BackupEntry
	raiseTo int64 // a deleted document: the version of the repair's delete
	count   *int
}

func (r *restoreRecords) restoreBatch(ctx context.Context, es *elasticsearch.Client, entries []BackupEntry, res *RestoreResult) error {
	skip := func(e BackupEntry, reason string) {
		res.Skipped = append(res.Skipped, Skip{Key: e.Key, Index: e.Index, ID: e.ID, Reason: reason})
	}
	var buf bytes.Buffer
	var steps []restoreStep
	type deletedDoc struct {
		e             BackupEntry
		deleteVersion int64
	}
	var absent []deletedDoc // deleted by the repair: put back if still absent
	for _, e := range entries {
		w, rewritten := r.written[e.Key]
		atTarget := rewritten && w.Index == e.Index && w.ID == e.ID
		del, deleted := r.deleted[docRef{e.Index, e.ID}]
		if !atTarget && !deleted {
			res.Untouched++
			continue
		}
		if why := r.changed[e.Key]; why != "" {
			skip(e, "not restored: "+why)
			continue
		}
		if _, kept := r.kept[e.Key]; !rewritten && !kept {
			skip(e, "not restored: the backup has no record of the group's document (gone before the repair), so a later write cannot be ruled out")
			continue
		}
		switch {
		case atTarget && e.Kind == BackupCreated:
			bulkAction(&buf, "delete", map[string]any{"_index": e.Index, "_id": e.ID, "if_seq_no": w.SeqNo, "if_primary_term": w.PrimaryTerm}, nil)
			steps = append(steps, restoreStep{e: e, count: &res.Removed})
		case atTarget:
			bulkAction(&buf, "index", map[string]any{"_index": e.Index, "_id": e.ID, "if_seq_no": w.SeqNo, "if_primary_term": w.PrimaryTerm}, e.Source)
			steps = append(steps, restoreStep{e: e, count: &res.Raised})
		default:
			absent = append(absent, deletedDoc{e, del.Version})
		}
	}
	if len(absent) > 0 {
		refs := make([]docRef, len(absent))
		for i, x := range absent {
			refs[i] = docRef{x.e.Index, x.e.ID}
		}
		got, err := mget(ctx, es, refs, false)
		if err != nil {
			return fmt.Errorf("indexer: restore: %w", err)
		}
		for _, x := range absent {
			if d := got[docRef{x.e.Index, x.e.ID}]; d.Found {
				skip(x.e, fmt.Sprintf("deleted by the repair but written again since (_version %d, _seq_no %d): left as it is", d.Version, d.SeqNo))
				continue
			}
			bulkAction(&buf, "index", map[string]any{"_index": x.e.Index, "_id": x.e.ID, "version": x.e.Version, "version_type": "external_gte"}, x.e.Source)
			steps = append(steps, restoreStep{e: x.e, raiseTo: x.deleteVersion, count: &res.Restored})
		}
	}
	if len(steps) == 0 {
		return nil
	}
	items, err := bulk(ctx, es, buf.Bytes())
	if err != nil {
		return fmt.Errorf("indexer: restore: %w", err)
	}
	buf.Reset()
	var raise []restoreStep
	for i, it := range items {
		st := steps[i]
		switch {
		case it.Status < 300:
			*st.count++
		case it.Status == 409 && st.raiseTo > 0 && restoreCurrentVersion(it) == st.raiseTo:
			// Elasticsearch still remembers the repair's own delete;
			// nothing was written since, so the delete is what this
			// undoes, at its version.
			bulkAction(&buf, "index", map[string]any{"_index": st.e.Index, "_id": st.e.ID, "version": st.raiseTo, "version_type": "external_gte"}, st.e.Source)
			raise = append(raise, st)
		case it.Status == 409:
			skip(st.e, "changed since the repair; left as it is ("+it.Reason()+")")
		default:
			skip(st.e, it.Reason())
		}
	}
	if len(raise) == 0 {
		return nil
	}
	items, err = bulk(ctx, es, buf.Bytes())
	if err != nil {
		return fmt.Errorf("indexer: restore: %w", err)
	}
	for i, it := range items {
		switch {
		case it.Status < 300:
			res.Raised++
		case it.Status == 409:
			skip(raise[i].e, "changed since the repair; left as it is ("+it.Reason()+")")
		default:
			skip(raise[i].e, it.Reason())
		}
	}
	return nil
}

func restoreCurrentVersion(it indexer.BulkItem) int64 {
	if it.Error == nil {
		return 0
	}
	v, _, _ := indexer.ConflictVersions(it.Error.Reason)
	return v
}
