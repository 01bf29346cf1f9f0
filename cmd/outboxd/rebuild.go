package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/progress"
	"github.com/outboxd/outboxd/rebuild"
)

func init() {
	register("rebuild", "move an index to new mappings or settings without downtime, while the relay runs", runRebuild)
}

func runRebuild(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rebuild", flag.ContinueOnError)
	db := addDBFlags(fs)
	es := addESFlags(fs)
	index := fs.String("index", "", "index name N (required)")
	mappingsFile := fs.String("mappings", "", "JSON file with the new index's mappings (default: the current index's)")
	settingsFile := fs.String("settings", "", "JSON file with the new index's settings (default: the current index's)")
	from := fs.String("from", "index", `where the documents come from: "index" (the current index) or "source" (--source-sql)`)
	sourceSQL := fs.String("source-sql", "", "with --from source: query returning id, version, document[, deleted] (required, unless N has a document definition: the new index is then filled from it)")
	acceptRejected := fs.Bool("accept-rejected", false, "swap even though the new index refused some documents")
	keep := fs.Duration("keep", 0, "drop the old index this long after the swap, at a later rebuild or --drop-old (0: keep it until --drop-old)")
	abort := fs.Bool("abort", false, "delete the half-built index of an unfinished rebuild instead")
	dropOld := fs.Bool("drop-old", false, "delete the index a finished rebuild swapped away from instead")
	forget := fs.Bool("forget", false, "delete the record of a rebuild whose indices are all gone, so the relay may start N over empty")
	batch := fs.Int("batch", 1000, "documents per bulk request")
	workers := fs.Int("bulk-workers", 4, "bulk requests at once")
	swapDelta := fs.Int("swap-delta", 1000, "swap once a catch-up round copies at most this many documents (or rounds stop shrinking)")
	grace := fs.Duration("grace", 2*time.Second, "wait after the swap before the final catch-up from the old index")
	sourceTimeout := fs.Duration("source-timeout", 10*time.Minute, "statement timeout of each cursor fetch (--from source)")
	outage := fs.Duration("outage-timeout", 5*time.Minute, "give up (resumable) after Elasticsearch was unreachable this long")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: outboxd rebuild --index N [--mappings FILE] [--settings FILE] [--from index|source] [flags]
       outboxd rebuild --index N --abort
       outboxd rebuild --index N --drop-old
       outboxd rebuild --index N --forget

Creates the next concrete index of N (N-000002 after N-000001, ...) with the
given mappings and settings, fills it from the current index (or from
--source-sql plus the current index's tombstones) while the relay keeps
writing, catches up with what was written meanwhile, and moves N, N-write
and N-read to it in one atomic request. State is stored in
<schema>.rebuilds: run the same command again after a crash to continue.
With --from source and no --source-sql, an index with a document definition
is filled from it, each document at the version of its read, so it orders
with the relay's refreshes caught up from the old index.
The old index is kept until --drop-old (or --keep). While the record of a
rebuild names an index that is gone, the relay will not create an empty N
in its place; --forget deletes that record (it refuses while an index it
names exists or one of N's aliases points at an index).

Exit status: 0 swapped (or aborted, dropped); 3 the new index refused
documents and nothing was swapped (listed; --accept-rejected or --abort).

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
	case btoi(*abort)+btoi(*dropOld)+btoi(*forget) > 1:
		return fmt.Errorf("abort, drop-old, forget: give at most one")
	}
	esCfg, err := es.config()
	if err != nil {
		return err
	}
	client, err := indexer.NewClient(esCfg)
	if err != nil {
		return err
	}
	pool, err := db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch {
	case *abort:
		gone, err := rebuild.Abort(ctx, pool, db.schema, client, *index)
		if err != nil {
			return err
		}
		fmt.Printf("aborted: deleted %s; %s unchanged\n", gone, *index)
		return nil
	case *forget:
		if err := rebuild.Forget(ctx, pool, db.schema, client, *index); err != nil {
			return err
		}
		fmt.Printf("forgot the rebuild record of %s; the relay will create %s empty on its next event\n", *index, indexer.FirstIndex(*index))
		return nil
	case *dropOld:
		dropped, err := rebuild.DropOld(ctx, pool, db.schema, client, *index)
		if err != nil {
			return err
		}
		fmt.Printf("dropped %v\n", dropped)
		return nil
	}
	if *from == "source" {
		if _, err := definitionSource(ctx, pool, db.schema, *index, *sourceSQL); err != nil {
			return err
		}
	}
	o := rebuild.Options{
		Pool: pool, Schema: db.schema, ES: client, Index: *index, From: *from, SourceSQL: *sourceSQL,
		AcceptRejected: *acceptRejected, Keep: *keep, SwapDelta: *swapDelta, Grace: *grace,
		Batch: *batch, Workers: *workers, SourceTimeout: *sourceTimeout, OutageTimeout: *outage, Logger: slog.Default(),
	}
	for _, f := range []struct {
		flag, path string
		dst        *[]byte
	}{{"mappings", *mappingsFile, &o.Mappings}, {"settings", *settingsFile, &o.Settings}} {
		if f.path == "" {
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return fmt.Errorf("%s: %w", f.flag, err)
		}
		if !json.Valid(b) {
			return fmt.Errorf("%s: %s is not valid JSON", f.flag, f.path)
		}
		*f.dst = b
	}
	o.Progress = progress.New("rebuild "+*index, 0, progress.Options{})
	rep, err := rebuild.Run(ctx, o)
	o.Progress.Finish()
	var rejected *rebuild.RejectedError
	if err != nil && !errors.As(err, &rejected) {
		return err
	}
	if *asJSON {
		if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
			return err
		}
	} else {
		if rep.Resumed != "" {
			fmt.Printf("continued an interrupted rebuild (%s)\n", rep.Resumed)
		}
		for _, d := range rep.DroppedOld {
			fmt.Printf("dropped %s (its keep time had passed)\n", d)
		}
		fmt.Printf("index %s (rebuild run %s): %s -> %s: %d copied, %d caught up in %d rounds, %d rejected, %.1fs; swapped: %t\n",
			rep.Index, rep.Run, rep.OldIndex, rep.NewIndex, rep.Copied, rep.CaughtUp, rep.Rounds, rep.Rejected, rep.Seconds, rep.Swapped)
		for _, r := range rep.Samples {
			fmt.Printf("  rejected %q: %s\n", r.ID, r.Reason)
		}
	}
	if rejected != nil {
		return &exitError{code: 3, err: err}
	}
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
