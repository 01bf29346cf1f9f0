package repair

import (
	"bytes"
	"context"
	"fmt"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/internal/progress"
	"github.com/outboxd/outboxd/internal/scan"
)

// ApplyOptions configures (*Plan).Apply.
type ApplyOptions struct {
	// BackupPath is required and must not exist yet; Apply refuses to
	// change anything until the backup is written and fsynced.
	BackupPath string
	// Audit receives repair.start, one repair.group per group and
	// repair.finish. Nil means no audit log (the command always opens one).
	Audit    *AuditLog
	Operator string
	// Batch is the number of documents per request; 0 means 500.
	Batch    int
	Progress *progress.Bar
}

// Skip is a document or group Apply (or a restore) left alone, and why.
type Skip struct {
	Key    string `json:"key,omitempty"`
	Index  string `json:"index"`
	ID     string `json:"_id"`
	Reason string `json:"reason"`
}

// Result counts what Apply did.
type Result struct {
	BackupPath string `json:"backup"`
	Groups     int    `json:"groups"` // groups completed without a skip
	Rewritten  int    `json:"rewritten"`
	Created    int    `json:"created"`
	Removed    int    `json:"removed"`
	Skipped    []Skip `json:"skipped,omitempty"`
}

// Apply executes the plan:
//
//  1. write the backup (every document to be overwritten or removed,
//     re-fetched by id with its source and coordinates, plus a line per
//     _id the repair will create and per keeper left in place) and fsync
//     it; on any failure nothing is changed;
//  2. per group: re-fetch a keeper that has to move and check its
//     _seq_no/_primary_term are still those of the scan (else the group is
//     skipped); write it to the write alias under _id = source_id at the
//     group's Version with version_type=external_gte (a newer version
//     there wins and the group is skipped); then delete the others with
//     if_seq_no + if_primary_term, so a document changed since the scan
//     gets a 409 and is skipped and reported, never lost;
//  3. append to the backup, and fsync, the _seq_no/_primary_term/_version
//     every write left: a restore undoes only writes proven the repair's.
//
// Groups with a Conflict are skipped. Apply returns an error only when it
// could not proceed at all; per-document refusals are in Skipped.
func (p *Plan) Apply(ctx context.Context, es *elasticsearch.Client, opts ApplyOptions) (*Result, error) {
	if opts.BackupPath == "" {
		return nil, fmt.Errorf("indexer: repair apply: backup: a backup path is required")
	}
	batch := opts.Batch
	if batch <= 0 {
		batch = 500
	}
	backup, err := writeBackup(ctx, es, p, opts.BackupPath, opts.Operator, batch)
	if err != nil {
		return nil, fmt.Errorf("%w (nothing was changed)", err)
	}
	res, err := p.apply(ctx, es, backup, batch, opts)
	if cerr := backup.close(); err == nil {
		err = cerr
	}
	return res, err
}

func (p *Plan) apply(ctx context.Context, es *elasticsearch.Client, backup *backupFile, batch int, opts ApplyOptions) (*Result, error) {
	s := p.Summary()
	if err := opts.Audit.Append(AuditEntry{Action: "repair.start", Index: p.Index, Reason: "backup " + opts.BackupPath, Detail: s}); err != nil {
		return nil, fmt.Errorf("%w (nothing was changed)", err)
	}
	if err := opts.Audit.Sync(); err != nil {
		return nil, fmt.Errorf("indexer: audit log: %w (nothing was changed)", err)
	}
	res := &Result{BackupPath: opts.BackupPath}
	start := 0
	for start < len(p.Groups) {
		end, n := start, 0
		for end < len(p.Groups) && (n == 0 || n+len(p.Groups[end].Remove)+1 <= batch) {
			n += len(p.Groups[end].Remove) + 1
			end++
		}
		if err := p.applyChunk(ctx, es, p.Groups[start:end], res, backup, opts); err != nil {
			return res, err
		}
		opts.Progress.Add(int64(end - start))
		start = end
	}
	err := opts.Audit.Append(AuditEntry{Action: "repair.finish", Index: p.Index, Outcome: fmt.Sprintf("groups %d, rewritten %d (created %d), removed %d, skipped %d", res.Groups, res.Rewritten, res.Created, res.Removed, len(res.Skipped)), Detail: res})
	if serr := opts.Audit.Sync(); err == nil {
		err = serr
	}
	return res, err
}

type groupState struct {
	skip    []Skip
	ids     []string
	removed int
}

func (p *Plan) applyChunk(ctx context.Context, es *elasticsearch.Client, groups []Group, res *Result, backup *backupFile, opts ApplyOptions) error {
	states := make([]groupState, len(groups))
	skipGroup := func(i int, d scan.Doc, reason string) {
		states[i].skip = append(states[i].skip, Skip{Key: groups[i].Key, Index: d.Index, ID: d.ID, Reason: reason})
	}
	for i, g := range groups {
		if g.Conflict != "" {
			skipGroup(i, g.Keeper, "conflict: "+g.Conflict)
		}
	}

	// 1. Keepers that move: still as scanned?
	var refs []docRef
	for i, g := range groups {
		if g.Rewrite && len(states[i].skip) == 0 {
			refs = append(refs, docRef{g.Keeper.Index, g.Keeper.ID})
		}
	}
	got, err := mget(ctx, es, refs, true)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	var writing []int
	for i, g := range groups {
		if !g.Rewrite || len(states[i].skip) > 0 {
			continue
		}
		d := got[docRef{g.Keeper.Index, g.Keeper.ID}]
		switch {
		case !d.Found:
			skipGroup(i, g.Keeper, "keeper deleted since the scan")
			continue
		case d.SeqNo != g.Keeper.SeqNo || d.PrimaryTerm != g.Keeper.PrimaryTerm:
			skipGroup(i, g.Keeper, fmt.Sprintf("keeper changed since the scan (_seq_no %d, now %d)", g.Keeper.SeqNo, d.SeqNo))
			continue
		}
		bulkAction(&buf, "index", map[string]any{"_index": p.WriteAlias, "_id": g.TargetID, "version": g.Version, "version_type": "external_gte"}, d.Source)
		writing = append(writing, i)
	}

	// 2. Rewrite them under _id = source_id in the write alias.
	if len(writing) > 0 {
		items, err := bulk(ctx, es, buf.Bytes())
		if err != nil {
			return err
		}
		for j, it := range items {
			i := writing[j]
			g := groups[i]
			if it.Status >= 300 {
				reason := "rewrite refused: " + it.Reason()
				if it.Status == 409 {
					reason = "rewrite refused: the target holds a newer version (" + it.Reason() + ")"
				}
				skipGroup(i, scan.Doc{Index: p.WriteIndex, ID: g.TargetID}, reason)
				continue
			}
			if err := backup.record(BackupEntry{Kind: BackupWritten, Key: g.Key, Index: p.WriteIndex, ID: g.TargetID, Version: it.Version, SeqNo: it.SeqNo, PrimaryTerm: it.PrimaryTerm}); err != nil {
				return err
			}
			res.Rewritten++
			if g.Overwrites == nil {
				res.Created++
			}
			states[i].ids = append(states[i].ids, p.WriteIndex+"/"+g.TargetID)
		}
	}

	// 3. Conditional deletes, only for groups whose keeper is in place.
	buf.Reset()
	type del struct {
		group int
		doc   scan.Doc
	}
	var dels []del
	for i, g := range groups {
		if len(states[i].skip) > 0 {
			continue
		}
		for _, d := range g.Remove {
			bulkAction(&buf, "delete", map[string]any{"_index": d.Index, "_id": d.ID, "if_seq_no": d.SeqNo, "if_primary_term": d.PrimaryTerm}, nil)
			dels = append(dels, del{i, d})
		}
	}
	if len(dels) > 0 {
		items, err := bulk(ctx, es, buf.Bytes())
		if err != nil {
			return err
		}
		for j, it := range items {
			x := dels[j]
			if it.Status >= 300 {
				reason := "delete refused: " + it.Reason()
				if it.Status == 409 {
					reason = "changed since the scan; kept (" + it.Reason() + ")"
				}
				skipGroup(x.group, x.doc, reason)
				continue
			}
			if err := backup.record(BackupEntry{Kind: BackupDeleted, Key: groups[x.group].Key, Index: x.doc.Index, ID: x.doc.ID, Version: it.Version, SeqNo: it.SeqNo, PrimaryTerm: it.PrimaryTerm}); err != nil {
				return err
			}
			res.Removed++
			states[x.group].removed++
			states[x.group].ids = append(states[x.group].ids, x.doc.Index+"/"+x.doc.ID)
		}
	}

	if err := backup.sync(); err != nil {
		return err
	}
	for i, g := range groups {
		st := states[i]
		outcome := "applied"
		if len(st.skip) > 0 {
			outcome = fmt.Sprintf("skipped %d: %s", len(st.skip), st.skip[0].Reason)
			res.Skipped = append(res.Skipped, st.skip...)
		} else {
			res.Groups++
		}
		if err := opts.Audit.Append(AuditEntry{Action: "repair.group", Index: p.Index, Key: g.Key, IDs: st.ids, Reason: g.Reason, Outcome: outcome}); err != nil {
			return err
		}
	}
	return nil
}
