package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/progress"
	"github.com/outboxd/outboxd/repair"
)

func init() {
	register("repair", "merge duplicate documents of an index (dry run unless --apply); 'repair restore BACKUP' undoes", runRepair)
}

const repairUsage = `Usage:
  outboxd repair --index NAME [flags]          plan (dry run) or --apply a repair
  outboxd repair restore [flags] BACKUP        put back what a repair backup holds

Repair groups every document behind NAME (the write alias, all its concrete
indices, tombstones included; or a concrete index) by a key and keeps one
document per key:

  keeper   a business version beats none, then the highest one (the source's
           --version-field when it holds an integer, or the _version of the
           copy at _id = source_id in the write index, where outboxd writes;
           elsewhere _version counts a legacy writer's writes), then the
           newest --updated-field, then the most writes, then the copy
           already at _id = source_id, then the copy in the write index.
           Tombstones (outboxd_deleted: true) and documents without the key
           never win over live documents, except that a tombstone at least as
           new as every live copy wins: the key stays deleted, because keeping
           a live copy would resurrect a deleted source.
  rewrite  a keeper not at _id = source_id in the write index is written there
           (version_type=external_gte) at its business version, or at 1 when
           it has none, so the outbox's next event for it is never stale
           because of a write count; its old copy is removed.
  remove   every other copy is deleted conditionally (if_seq_no +
           if_primary_term): a document changed since the scan is skipped and
           reported, never lost.

  missing  documents without the key are left alone. With --key source_id a
           document without a source_id field has it only in the write
           index (its _id, where outboxd writes); elsewhere it is left
           alone unless --include-missing-key groups it by its _id.

Without --apply nothing changes: the plan and a summary are printed. With
--apply the backup (NDJSON: index, _id, _version, _seq_no, _primary_term,
_source of every document touched, plus the _ids the repair creates) is
written and fsynced first; if it cannot be, nothing changes; then the
coordinates each of the repair's writes left are appended to it, so that
'repair restore' undoes those writes and nothing else. Every step is appended
to the audit log (JSON lines).

Exit status: 0 done; 3 applied but some documents were skipped (listed).

Flags:
`

func runRepair(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "restore" {
		return runRepairRestore(ctx, args[1:])
	}
	fs := flag.NewFlagSet("repair", flag.ContinueOnError)
	es := addESFlags(fs)
	index := fs.String("index", "", "write alias or concrete index to repair (required)")
	key := fs.String("key", "source_id", "grouping key: source_id (the source_id field, else _id), canonical_url, or FIELD[,FIELD] (dotted paths allowed)")
	versionField := fs.String("version-field", "version", "source field with the business version; documents without it rank by _version")
	updatedField := fs.String("updated-field", "updated_at", "source field that breaks version ties (RFC 3339, epoch number or string)")
	apply := fs.Bool("apply", false, "execute the plan (default: dry run)")
	backup := fs.String("backup", "", "backup file to create with --apply (must not exist; default outboxd-repair-INDEX-TIMESTAMP.ndjson in --backup-dir)")
	backupDir := fs.String("backup-dir", ".", "directory for the default backup file")
	auditLog := fs.String("audit-log", "outboxd-audit.jsonl", "audit log to append to (JSON lines)")
	operator := fs.String("operator", envOr("USER", "unknown"), "operator name recorded in the audit log")
	asJSON := fs.Bool("json", false, "print the plan (and result) as JSON instead of text")
	pageSize := fs.Int("page-size", 1000, "documents per scan page")
	includeMissingKey := fs.Bool("include-missing-key", false, "with --key source_id, also group documents without a source_id field outside the write index by their _id (moving them into the write index); by default they are left alone")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), repairUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (did you mean 'outboxd repair restore BACKUP'?)", fs.Arg(0))
	}
	if *index == "" {
		return fmt.Errorf("index: required (--index NAME)")
	}
	keyFields, err := repair.ParseKey(*key)
	if err != nil {
		return err
	}
	client, err := es.client()
	if err != nil {
		return err
	}

	prog := progress.New("scan "+*index, 0, progress.Options{Logger: slog.Default()})
	plan, err := repair.PlanDuplicates(ctx, client, repair.Options{
		Index: *index, Key: keyFields, VersionField: *versionField, UpdatedField: *updatedField,
		PageSize: *pageSize, Progress: prog, IncludeMissingKey: *includeMissingKey,
	})
	prog.Finish()
	if err != nil {
		return err
	}
	if *asJSON && !*apply {
		return json.NewEncoder(os.Stdout).Encode(map[string]any{"plan": plan, "summary": plan.Summary()})
	}
	if !*asJSON {
		if err := plan.WriteText(os.Stdout); err != nil {
			return err
		}
	}
	if !*apply {
		if !*asJSON {
			fmt.Println("dry run: nothing was changed; rerun with --apply to execute this plan")
		}
		return nil
	}
	if len(plan.Groups) == 0 {
		if *asJSON {
			return json.NewEncoder(os.Stdout).Encode(map[string]any{"plan": plan, "summary": plan.Summary()})
		}
		fmt.Println("nothing to repair")
		return nil
	}

	path := *backup
	if path == "" {
		name := fmt.Sprintf("outboxd-repair-%s-%s.ndjson", strings.ReplaceAll(*index, "/", "_"), time.Now().UTC().Format("20060102T150405Z"))
		path = filepath.Join(*backupDir, name)
	}
	audit, err := repair.OpenAuditLog(*auditLog, *operator)
	if err != nil {
		return fmt.Errorf("%w (nothing was changed)", err)
	}
	defer audit.Close()
	aprog := progress.New("repair "+*index, int64(len(plan.Groups)), progress.Options{Logger: slog.Default()})
	res, err := plan.Apply(ctx, client, repair.ApplyOptions{BackupPath: path, Audit: audit, Operator: *operator, Progress: aprog})
	aprog.Finish()
	if err != nil {
		return err
	}
	if *asJSON {
		if err := json.NewEncoder(os.Stdout).Encode(map[string]any{"plan": plan, "summary": plan.Summary(), "result": res}); err != nil {
			return err
		}
	} else {
		for _, s := range res.Skipped {
			fmt.Printf("skipped %s/%s (group %q): %s\n", s.Index, s.ID, s.Key, s.Reason)
		}
		fmt.Printf("applied: %d groups repaired, %d keepers rewritten (%d new _ids), %d documents removed, %d skipped; backup %s; undo with: outboxd repair restore %s\n",
			res.Groups, res.Rewritten, res.Created, res.Removed, len(res.Skipped), path, path)
	}
	if len(res.Skipped) > 0 {
		return &exitError{code: 3, err: fmt.Errorf("%d documents were skipped (changed since the scan or refused); rerun repair to plan them again", len(res.Skipped))}
	}
	return nil
}

func runRepairRestore(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("repair restore", flag.ContinueOnError)
	es := addESFlags(fs)
	auditLog := fs.String("audit-log", "outboxd-audit.jsonl", "audit log to append to (JSON lines)")
	operator := fs.String("operator", envOr("USER", "unknown"), "operator name recorded in the audit log")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: outboxd repair restore [flags] BACKUP

Undoes what the repair recorded in BACKUP that it wrote, and nothing else. A
group is undone only while its document at _id = source_id is exactly what the
repair left (same _seq_no and _primary_term); a group written since (an
update or a delete through the outbox) is skipped and reported, because
undoing it would overwrite the newer write or bring back stale copies.
Otherwise: a document the repair overwrote gets its source back (conditionally
on the repair's _seq_no; its _version becomes the repair's + 1, since versions
cannot go down: counted as "raised"); a document it created is deleted on the
same condition; a document it deleted is put back at its backed-up _version
(version_type=external_gte) if its _id is still absent, or at the version of
the repair's own delete while Elasticsearch remembers it (index.gc_deletes,
60s by default; "raised"). Backups written before these records existed are
refused.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("backup: exactly one backup file is required")
	}
	client, err := es.client()
	if err != nil {
		return err
	}
	audit, err := repair.OpenAuditLog(*auditLog, *operator)
	if err != nil {
		return err
	}
	defer audit.Close()
	prog := progress.New("restore", 0, progress.Options{Logger: slog.Default()})
	res, err := repair.Restore(ctx, client, fs.Arg(0), repair.RestoreOptions{Audit: audit, Progress: prog})
	prog.Finish()
	if err != nil {
		return err
	}
	for _, s := range res.Skipped {
		fmt.Printf("skipped %s/%s (group %q): %s\n", s.Index, s.ID, s.Key, s.Reason)
	}
	fmt.Printf("restored %d documents at their version, %d at a raised version, removed %d created documents, %d not written by the repair, %d skipped (changed since the repair)\n", res.Restored, res.Raised, res.Removed, res.Untouched, len(res.Skipped))
	if len(res.Skipped) > 0 {
		return &exitError{code: 3, err: fmt.Errorf("%d documents were skipped", len(res.Skipped))}
	}
	return nil
}
