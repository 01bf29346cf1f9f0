package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/indexer"
)

func init() {
	register("migrate-index", "upgrade indexes to the current alias layout in place (the relay also does this on start)", runMigrateIndex)
}

func runMigrateIndex(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate-index", flag.ContinueOnError)
	es := addESFlags(fs)
	index := fs.String("index", "", "index name N to upgrade")
	all := fs.Bool("all", false, "upgrade every index outboxd manages")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if (*index == "") == !*all {
		return errors.New("index: pass --index N or --all")
	}
	client, err := es.client()
	if err != nil {
		return err
	}
	names := []string{*index}
	if *all {
		if names, err = indexer.ManagedIndexes(ctx, client); err != nil {
			return err
		}
	}
	var errs []error
	for _, n := range names {
		changed, err := indexer.MigrateLayout(ctx, client, n)
		if err != nil {
			errs = append(errs, fmt.Errorf("index %s: %w", n, err))
			continue
		}
		slog.Info("index layout checked", "index", n, "upgraded", changed, "search", n, "write", indexer.WriteAlias(n))
	}
	return errors.Join(errs...)
}

// upgradeLayouts brings the indexes outboxd manages (only, when given,
// those in only) to the current layout when the relay starts, so N turns
// clean without waiting for an event. It only logs: Elasticsearch may be
// down at start, and the sink upgrades each name again on its first write.
func upgradeLayouts(ctx context.Context, client *elasticsearch.Client, only []string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	names, err := indexer.ManagedIndexes(ctx, client)
	if err != nil {
		log.Warn("index layout upgrade skipped", "error", err.Error())
		return
	}
	if len(only) > 0 {
		names = slices.DeleteFunc(names, func(n string) bool { return !slices.Contains(only, n) })
	}
	for _, n := range names {
		if changed, err := indexer.MigrateLayout(ctx, client, n); err != nil {
			log.Warn("index layout upgrade failed", "index", n, "error", err.Error())
		} else if changed {
			log.Info("index layout upgraded", "index", n, "write", indexer.WriteAlias(n))
		}
	}
}
