package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"

	"github.com/outboxd/outboxd/internal/progress"
	"github.com/outboxd/outboxd/reconcile"
)

func init() {
	register("reconcile", "compare the database's truth with an index; --apply fixes drift through the outbox", runReconcile)
}

func runReconcile(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	db := addDBFlags(fs)
	es := addESFlags(fs)
	index := fs.String("index", "", "write alias N (the events' index_name); every index behind it is scanned (required)")
	sourceSQL := fs.String("source-sql", "", "query returning source_id, version, document[, deleted]; a NULL document or deleted=true means deleted in the source (required, unless N has a document definition: it is then the truth)")
	sourceTimeout := fs.Duration("source-timeout", reconcile.DefaultSourceTimeout, "statement timeout of --source-sql, which runs in a READ ONLY transaction")
	versionField := fs.String("version-field", "", "legacy indexes only: the document field holding the version (default: _version, which outboxd sets to the event's version)")
	apply := fs.Bool("apply", false, "append fix events to the outbox (default: report only)")
	sample := fs.Int("sample", 10, "samples printed per kind of drift")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	operator := fs.String("operator", envOr("USER", "outboxd reconcile"), "operator recorded in <schema>.audit_log for --apply")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: outboxd reconcile --index N --source-sql "SELECT source_id, version, document FROM ..." [flags]
       outboxd reconcile --index N [flags]   (N has a document definition)

The source SQL runs in a READ ONLY transaction with --source-timeout as its
statement_timeout. Versions are compared with each document's _version, which
outboxd sets to the event's version; --version-field reads them from a
document field instead, for indexes outboxd did not write.

Reports, with counts and samples:
  missing      live in the source, not visible in the index
  stale        visible at a lower version than the source's
  extra        visible in the index, no source row
  resurrected  deleted in the source, visible in the index
  duplicate    several live documents for one source_id (fix: outboxd repair)
  ahead        visible at a higher version than the source's, other content
               (events lost by a PostgreSQL failover after their delivery)

--apply appends one outbox event per fixable drift, so fixes take the same
versioned path as every write: upserts at max(source version, index
_version) for missing/stale, deletes at max(source version, index _version + 1)
for resurrected and at index _version + 1 for extra, upserts of the source's
document at index _version + 1 for ahead. The relay delivers them.
Drifts whose visible copy is not at _id = source_id need 'outboxd repair'.

Without --source-sql, an index with a document definition is compared with
it: every id of its ids query (and every id the index shows that the
query did not list) is read from the definition in batches and compared
with the index's copy: missing, stale (other content, older than the read)
and extra (no document any more). --apply appends a refresh of each; the
relay reads it again, at a version above every earlier read.

Exit status: 0 no drift (or every drift fixed by --apply); 3 drift remains
(for cron alerting).

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *index == "":
		return fmt.Errorf("index: required (--index N)")
	case *sourceTimeout <= 0:
		return fmt.Errorf("source-timeout: must be > 0, got %s", *sourceTimeout)
	case *sample < 0:
		return fmt.Errorf("sample: must be >= 0, got %d", *sample)
	}
	client, err := es.client()
	if err != nil {
		return err
	}
	pool, err := db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := definitionSource(ctx, pool, db.schema, *index, *sourceSQL); err != nil {
		return err
	}
	prog := progress.New("scan "+*index, 0, progress.Options{Logger: slog.Default()})
	rep, err := reconcile.Run(ctx, reconcile.Options{
		ES: client, DB: pool, Schema: db.schema, Index: *index, SourceSQL: *sourceSQL,
		SourceTimeout: *sourceTimeout, VersionField: *versionField, Apply: *apply, Sample: max(*sample, 1), Operator: *operator, Progress: prog,
	})
	prog.Finish()
	if err != nil {
		return err
	}
	if *asJSON {
		if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
			return err
		}
	} else {
		reconcilePrint(rep, *sample)
	}
	remaining := rep.NeedsRepair + rep.Counts[reconcile.DriftDuplicate]
	if !rep.Applied {
		remaining += rep.Events
	}
	if remaining > 0 {
		return &exitError{code: 3, err: fmt.Errorf("%d drifts remain", remaining)}
	}
	return nil
}

func reconcilePrint(rep *reconcile.Report, sample int) {
	fmt.Printf("index %s: %d documents (%d source_ids); source: %d rows\n", rep.Index, rep.IndexDocs, rep.IndexKeys, rep.SourceRows)
	kinds := []string{reconcile.DriftMissing, reconcile.DriftStale, reconcile.DriftExtra, reconcile.DriftResurrected, reconcile.DriftDuplicate, reconcile.DriftAhead}
	for _, k := range kinds {
		fmt.Printf("  %-12s %d\n", k, rep.Counts[k])
	}
	for _, k := range kinds {
		s := rep.Samples[k]
		sort.SliceStable(s, func(i, j int) bool { return s[i].SourceID < s[j].SourceID })
		for i, d := range s {
			if i >= sample {
				break
			}
			fmt.Printf("  %s %q: source version %d, index version %d, live copies %d: %s\n", k, d.SourceID, d.SourceVersion, d.IndexVersion, d.LiveDocs, d.Fix)
		}
	}
	verb := "would append"
	if rep.Applied {
		verb = "appended"
	}
	fmt.Printf("%s %d fix events; %d drifts need 'outboxd repair'\n", verb, rep.Events, rep.NeedsRepair)
}
