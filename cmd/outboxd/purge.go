package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/indexer"
)

func init() {
	register("purge-tombstones", "remove delete tombstones older than a horizon (the relay also does this on a schedule)", runPurge)
}

func runPurge(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("purge-tombstones", flag.ContinueOnError)
	es := addESFlags(fs)
	index := fs.String("index", "", "index name to purge (default: every index outboxd manages)")
	horizon := fs.Duration("horizon", 30*24*time.Hour, "purge tombstones older than this; keep it longer than any replay window")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *horizon < time.Minute {
		return fmt.Errorf("horizon: %s is too short: an older upsert arriving later would resurrect the document", *horizon)
	}
	client, err := es.client()
	if err != nil {
		return err
	}
	names := []string{*index}
	if *index == "" {
		if names, err = indexer.ManagedIndexes(ctx, client); err != nil {
			return err
		}
	}
	var errs []error
	for _, n := range names {
		purged, err := indexer.PurgeTombstones(ctx, client, n, *horizon)
		if err != nil {
			errs = append(errs, fmt.Errorf("index %s: %w", n, err))
			continue
		}
		slog.Info("tombstones purged", "index", n, "purged", purged, "horizon", *horizon)
	}
	return errors.Join(errs...)
}
