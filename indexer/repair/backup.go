package repair

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/indexer"
)

// Backup kinds. A repair backup is NDJSON: one header line, then one line
// per document the repair will touch (with its source and the coordinates
// it had) and one line per document the repair will create, so a restore
// can remove what did not exist before.
const (
	BackupHeader   = "header"
	BackupDocument = "document"
	BackupCreated  = "created"
)

// BackupEntry is one line of a repair backup.
type BackupEntry struct {
	Kind        string          `json:"kind"`
	Index       string          `json:"index,omitempty"`
	ID          string          `json:"_id,omitempty"`
	Version     int64           `json:"_version,omitempty"` // for created: the version the repair writes
	SeqNo       int64           `json:"_seq_no,omitempty"`
	PrimaryTerm int64           `json:"_primary_term,omitempty"`
	Source      json.RawMessage `json:"_source,omitempty"`
	// Header only.
	Target   string    `json:"target,omitempty"`
	Operator string    `json:"operator,omitempty"`
	Time     time.Time `json:"time,omitzero"`
}

type docRef struct{ index, id string }

type fetched struct {
	Index       string          `json:"_index"`
	ID          string          `json:"_id"`
	Found       bool            `json:"found"`
	Version     int64           `json:"_version"`
	SeqNo       int64           `json:"_seq_no"`
	PrimaryTerm int64           `json:"_primary_term"`
	Source      json.RawMessage `json:"_source"`
}

// mget fetches documents by (index, _id) in one request.
func mget(ctx context.Context, es *elasticsearch.Client, refs []docRef, source bool) (map[docRef]fetched, error) {
	out := make(map[docRef]fetched, len(refs))
	if len(refs) == 0 {
		return out, nil
	}
	type doc struct {
		Index  string `json:"_index"`
		ID     string `json:"_id"`
		Source bool   `json:"_source"`
	}
	docs := make([]doc, len(refs))
	for i, r := range refs {
		docs[i] = doc{r.index, r.id, source}
	}
	body, err := json.Marshal(map[string]any{"docs": docs})
	if err != nil {
		return nil, err
	}
	realtime := true
	var res struct {
		Docs []fetched `json:"docs"`
	}
	if err := scanDo(ctx, es, "mget", esapi.MgetRequest{Body: bytes.NewReader(body), Realtime: &realtime}, &res); err != nil {
		return nil, err
	}
	for _, d := range res.Docs {
		out[docRef{d.Index, d.ID}] = d
	}
	return out, nil
}

// bulk sends an NDJSON bulk body and returns the items in order.
func bulk(ctx context.Context, es *elasticsearch.Client, body []byte) ([]indexer.BulkItem, error) {
	var res struct {
		Items []map[string]indexer.BulkItem `json:"items"`
	}
	if err := scanDo(ctx, es, "bulk", esapi.BulkRequest{Body: bytes.NewReader(body)}, &res); err != nil {
		return nil, err
	}
	out := make([]indexer.BulkItem, len(res.Items))
	for i, m := range res.Items {
		for _, it := range m {
			out[i] = it
		}
	}
	return out, nil
}

func bulkAction(buf *bytes.Buffer, action string, meta map[string]any, source json.RawMessage) {
	b, _ := json.Marshal(map[string]any{action: meta})
	buf.Write(b)
	buf.WriteByte('\n')
	if source != nil {
		buf.Write(source)
		buf.WriteByte('\n')
	}
}

// writeBackup writes the backup of every document plan touches and
// every document it creates, then fsyncs the file and its directory. The
// file must not exist: a backup is never overwritten.
func writeBackup(ctx context.Context, es *elasticsearch.Client, plan *Plan, path, operator string, batch int) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("indexer: backup: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("indexer: backup: %w", cerr)
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	enc := json.NewEncoder(w)
	if err := enc.Encode(BackupEntry{Kind: BackupHeader, Index: plan.Index, Target: plan.WriteIndex, Operator: operator, Time: time.Now().UTC()}); err != nil {
		return fmt.Errorf("indexer: backup: %w", err)
	}
	var refs []docRef
	flush := func() error {
		got, err := mget(ctx, es, refs, true)
		if err != nil {
			return err
		}
		for _, r := range refs {
			d, ok := got[r]
			if !ok || !d.Found {
				continue // gone since the scan; its conditional delete will report it
			}
			e := BackupEntry{Kind: BackupDocument, Index: d.Index, ID: d.ID, Version: d.Version, SeqNo: d.SeqNo, PrimaryTerm: d.PrimaryTerm, Source: d.Source}
			if err := enc.Encode(e); err != nil {
				return err
			}
		}
		refs = refs[:0]
		return nil
	}
	for _, g := range plan.Groups {
		if g.Conflict != "" {
			continue
		}
		if g.Rewrite && g.Overwrites == nil {
			if err := enc.Encode(BackupEntry{Kind: BackupCreated, Index: plan.WriteIndex, ID: g.TargetID, Version: g.Keeper.Version}); err != nil {
				return fmt.Errorf("indexer: backup: %w", err)
			}
		}
		if g.Overwrites != nil {
			refs = append(refs, docRef{g.Overwrites.Index, g.Overwrites.ID})
		}
		for _, d := range g.Remove {
			refs = append(refs, docRef{d.Index, d.ID})
		}
		if len(refs) >= batch {
			if err := flush(); err != nil {
				return fmt.Errorf("indexer: backup: %w", err)
			}
		}
	}
	if err := flush(); err != nil {
		return fmt.Errorf("indexer: backup: %w", err)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("indexer: backup: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("indexer: backup: fsync: %w", err)
	}
	// The file's directory entry must be durable too, or a crash can lose
	// the backup of documents already deleted.
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		serr := d.Sync()
		d.Close()
		if serr != nil {
			return fmt.Errorf("indexer: backup: fsync directory: %w", serr)
		}
	}
	return nil
}

// RestoreOptions configures Restore.
type RestoreOptions struct {
	Audit    *AuditLog
	Batch    int // documents per request; 0 means 500
	Progress *Progress
}

// RestoreResult counts a restore.
type RestoreResult struct {
	Restored int `json:"restored"` // at their backed-up _version
	// Raised were restored with their backed-up source but at the version
	// Elasticsearch holds now: external versioning cannot go down while
	// a newer version is known (the repair's rewrite, or the delete
	// tombstone Elasticsearch keeps for index.gc_deletes, 60s by default).
	Raised  int    `json:"raised"`
	Removed int    `json:"removed"` // documents the repair had created
	Skipped []Skip `json:"skipped,omitempty"`
}

// Restore puts back what a repair backup holds: every backed-up
// document under its index and _id with its source, at its backed-up
// _version (version_type=external_gte) when Elasticsearch allows it; and
// removes every document the repair created, unless it changed since (its
// _version is no longer the one the repair wrote), which is reported.
func Restore(ctx context.Context, es *elasticsearch.Client, path string, opts RestoreOptions) (*RestoreResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("indexer: restore: %w", err)
	}
	defer f.Close()
	batch := opts.Batch
	if batch <= 0 {
		batch = 500
	}
	res := &RestoreResult{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 512<<20)
	var pending []BackupEntry
	line := 0
	sawHeader := false
	for sc.Scan() {
		line++
		var e BackupEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return res, fmt.Errorf("indexer: restore: %s line %d: %w", path, line, err)
		}
		switch e.Kind {
		case BackupHeader:
			sawHeader = true
			continue
		case BackupDocument, BackupCreated:
		default:
			return res, fmt.Errorf("indexer: restore: %s line %d: kind: unknown %q", path, line, e.Kind)
		}
		if !sawHeader {
			return res, fmt.Errorf("indexer: restore: %s: not a repair backup (no header line)", path)
		}
		pending = append(pending, e)
		if len(pending) >= batch {
			if err := restoreBatch(ctx, es, pending, res, opts); err != nil {
				return res, err
			}
			pending = pending[:0]
		}
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("indexer: restore: %s: %w", path, err)
	}
	if err := restoreBatch(ctx, es, pending, res, opts); err != nil {
		return res, err
	}
	_ = opts.Audit.Append(AuditEntry{Action: "repair.restore", Reason: "restore from " + path, Outcome: fmt.Sprintf("restored %d, raised %d, removed %d, skipped %d", res.Restored, res.Raised, res.Removed, len(res.Skipped))})
	return res, opts.Audit.Sync()
}

func restoreBatch(ctx context.Context, es *elasticsearch.Client, entries []BackupEntry, res *RestoreResult, opts RestoreOptions) error {
	if len(entries) == 0 {
		return nil
	}
	var created []docRef
	var docs []BackupEntry
	for _, e := range entries {
		if e.Kind == BackupCreated {
			created = append(created, docRef{e.Index, e.ID})
		} else {
			docs = append(docs, e)
		}
	}
	// Remove the repair's creations, but only as the repair left them.
	if len(created) > 0 {
		got, err := mget(ctx, es, created, false)
		if err != nil {
			return fmt.Errorf("indexer: restore: %w", err)
		}
		var buf bytes.Buffer
		var refs []docRef
		for _, e := range entries {
			if e.Kind != BackupCreated {
				continue
			}
			d := got[docRef{e.Index, e.ID}]
			switch {
			case !d.Found:
				continue
			case d.Version != e.Version:
				res.Skipped = append(res.Skipped, Skip{Index: e.Index, ID: e.ID, Reason: fmt.Sprintf("created by the repair at version %d but now at %d: changed since, left in place", e.Version, d.Version)})
				continue
			}
			bulkAction(&buf, "delete", map[string]any{"_index": e.Index, "_id": e.ID, "if_seq_no": d.SeqNo, "if_primary_term": d.PrimaryTerm}, nil)
			refs = append(refs, docRef{e.Index, e.ID})
		}
		if len(refs) > 0 {
			items, err := bulk(ctx, es, buf.Bytes())
			if err != nil {
				return fmt.Errorf("indexer: restore: %w", err)
			}
			for i, it := range items {
				if it.Status < 300 {
					res.Removed++
				} else {
					res.Skipped = append(res.Skipped, Skip{Index: refs[i].index, ID: refs[i].id, Reason: "remove created document: " + it.Reason()})
				}
			}
		}
	}
	if len(docs) == 0 {
		return nil
	}
	var buf bytes.Buffer
	for _, e := range docs {
		bulkAction(&buf, "index", map[string]any{"_index": e.Index, "_id": e.ID, "version": e.Version, "version_type": "external_gte"}, e.Source)
	}
	items, err := bulk(ctx, es, buf.Bytes())
	if err != nil {
		return fmt.Errorf("indexer: restore: %w", err)
	}
	buf.Reset()
	var raised []BackupEntry
	for i, it := range items {
		e := docs[i]
		switch {
		case it.Status < 300:
			res.Restored++
		case it.Status == 409 && it.Error != nil:
			v, _, ok := indexer.ConflictVersions(it.Error.Reason)
			if !ok {
				res.Skipped = append(res.Skipped, Skip{Index: e.Index, ID: e.ID, Reason: it.Reason()})
				continue
			}
			bulkAction(&buf, "index", map[string]any{"_index": e.Index, "_id": e.ID, "version": v, "version_type": "external_gte"}, e.Source)
			raised = append(raised, e)
		default:
			res.Skipped = append(res.Skipped, Skip{Index: e.Index, ID: e.ID, Reason: it.Reason()})
		}
	}
	opts.Progress.Add(int64(len(entries)))
	if len(raised) == 0 {
		return nil
	}
	items, err = bulk(ctx, es, buf.Bytes())
	if err != nil {
		return fmt.Errorf("indexer: restore: %w", err)
	}
	for i, it := range items {
		if it.Status < 300 {
			res.Raised++
		} else {
			res.Skipped = append(res.Skipped, Skip{Index: raised[i].Index, ID: raised[i].ID, Reason: it.Reason()})
		}
	}
	return nil
}
