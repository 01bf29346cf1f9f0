package repair

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/scan"
)

// Backup kinds. A repair backup is NDJSON: a header line; before the
// repair changes anything, a line per document it will delete or overwrite
// (with its source and coordinates), per _id its rewrite will create, and
// per keeper it leaves in place; then, as the repair goes, a line per write
// it made with the coordinates that write left. Restore undoes only what
// those last lines prove the repair wrote.
const (
	BackupHeader   = "header"
	BackupDocument = "document" // to be deleted or overwritten: source and coordinates
	BackupCreated  = "created"  // an _id the rewrite creates
	BackupKept     = "kept"     // a keeper left in place, as it was
	BackupWritten  = "written"  // what the rewrite left at the group's _id
	BackupDeleted  = "deleted"  // what a delete left (the delete's _version)
)

// BackupFormat is the header's format. Restore refuses backups without it:
// they do not say what the repair wrote, so a restore could not tell the
// repair's writes from later ones.
const BackupFormat = 2

// BackupEntry is one line of a repair backup.
type BackupEntry struct {
	Kind        string          `json:"kind"`
	Key         string          `json:"key,omitempty"` // the group
	Index       string          `json:"index,omitempty"`
	ID          string          `json:"_id,omitempty"`
	Version     int64           `json:"_version,omitempty"` // for created: the version the repair writes
	SeqNo       int64           `json:"_seq_no,omitempty"`
	PrimaryTerm int64           `json:"_primary_term,omitempty"`
	Source      json.RawMessage `json:"_source,omitempty"`
	// Header only.
	Format   int       `json:"format,omitempty"`
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
	if err := scan.Do(ctx, es, "mget", esapi.MgetRequest{Body: bytes.NewReader(body), Realtime: &realtime}, &res); err != nil {
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
	if err := scan.Do(ctx, es, "bulk", esapi.BulkRequest{Body: bytes.NewReader(body)}, &res); err != nil {
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

// backupFile is a backup file open for the apply step's records.
type backupFile struct {
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
}

func (b *backupFile) record(e BackupEntry) error {
	if err := b.enc.Encode(e); err != nil {
		return fmt.Errorf("indexer: backup: %w", err)
	}
	return nil
}

// sync makes every record so far durable: a restore trusts only what the
// file proves the repair wrote.
func (b *backupFile) sync() error {
	if err := b.w.Flush(); err != nil {
		return fmt.Errorf("indexer: backup: %w", err)
	}
	if err := b.f.Sync(); err != nil {
		return fmt.Errorf("indexer: backup: fsync: %w", err)
	}
	return nil
}

func (b *backupFile) close() error {
	err := b.sync()
	if cerr := b.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("indexer: backup: %w", cerr)
	}
	return err
}

// writeBackup writes the backup of every document plan touches, every
// document it creates and every keeper it leaves in place, then fsyncs the
// file and its directory, and returns it open for the apply step's
// records. The file must not exist: a backup is never overwritten.
func writeBackup(ctx context.Context, es *elasticsearch.Client, plan *Plan, path, operator string, batch int) (_ *backupFile, err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("indexer: backup: %w", err)
	}
	b := &backupFile{f: f, w: bufio.NewWriterSize(f, 1<<20)}
	b.enc = json.NewEncoder(b.w)
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := b.record(BackupEntry{Kind: BackupHeader, Format: BackupFormat, Index: plan.Index, Target: plan.WriteIndex, Operator: operator, Time: time.Now().UTC()}); err != nil {
		return nil, err
	}
	type want struct {
		ref  docRef
		kind string
		key  string
	}
	var wants []want
	flush := func() error {
		// Keepers left in place need no source: one mget for them, one
		// with sources for the rest.
		var docs, kept []docRef
		for _, x := range wants {
			if x.kind == BackupKept {
				kept = append(kept, x.ref)
			} else {
				docs = append(docs, x.ref)
			}
		}
		got, err := mget(ctx, es, docs, true)
		if err != nil {
			return fmt.Errorf("indexer: backup: %w", err)
		}
		gotKept, err := mget(ctx, es, kept, false)
		if err != nil {
			return fmt.Errorf("indexer: backup: %w", err)
		}
		maps.Copy(got, gotKept)
		for _, x := range wants {
			d, ok := got[x.ref]
			if !ok || !d.Found {
				continue // gone since the scan; its conditional write will report it
			}
			e := BackupEntry{Kind: x.kind, Key: x.key, Index: d.Index, ID: d.ID, Version: d.Version, SeqNo: d.SeqNo, PrimaryTerm: d.PrimaryTerm}
			if x.kind == BackupDocument {
				e.Source = d.Source
			}
			if err := b.record(e); err != nil {
				return err
			}
		}
		wants = wants[:0]
		return nil
	}
	for _, g := range plan.Groups {
		if g.Conflict != "" {
			continue
		}
		if g.Rewrite && g.Overwrites == nil {
			if err := b.record(BackupEntry{Kind: BackupCreated, Key: g.Key, Index: plan.WriteIndex, ID: g.TargetID, Version: g.Version}); err != nil {
				return nil, err
			}
		}
		if !g.Rewrite {
			wants = append(wants, want{docRef{g.Keeper.Index, g.Keeper.ID}, BackupKept, g.Key})
		}
		if g.Overwrites != nil {
			wants = append(wants, want{docRef{g.Overwrites.Index, g.Overwrites.ID}, BackupDocument, g.Key})
		}
		for _, d := range g.Remove {
			wants = append(wants, want{docRef{d.Index, d.ID}, BackupDocument, g.Key})
		}
		if len(wants) >= batch {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if err := b.sync(); err != nil {
		return nil, err
	}
	// The file's directory entry must be durable too, or a crash can lose
	// the backup of documents already deleted.
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		serr := d.Sync()
		d.Close()
		if serr != nil {
			return nil, fmt.Errorf("indexer: backup: fsync directory: %w", serr)
		}
	}
	return b, nil
}
