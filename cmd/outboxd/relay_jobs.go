package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/reconcile"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/webhook"
)

func addJobs(s *jobs.Scheduler, pool *pgxpool.Pool, es *elasticsearch.Client, schemaName string, f relayFlags) error {
	if err := s.Add("outbox-retention", f.retentionSchedule, func(ctx context.Context) error {
		// Waiting messages of a destination served here whose event went
		// before it was served get one the destination's stream reads.
		if _, err := webhook.RequeueWaiting(ctx, pool, schemaName, destinationNames(f.destinations)); err != nil {
			return err
		}
		n, err := relay.DeleteAcknowledged(ctx, pool, schemaName, f.retention, 5000)
		slog.Info("retention: deleted acknowledged events", "deleted", n, "retention", f.retention)
		return err
	}); err != nil {
		return err
	}
	if err := s.Add("ledger-retention", f.retentionSchedule, func(ctx context.Context) error {
		n, err := webhook.PurgeLedger(ctx, pool, schemaName, f.ledgerRetention, 5000)
		slog.Info("retention: deleted final ledger rows", "deleted", n, "ledger_retention", f.ledgerRetention)
		return err
	}); err != nil {
		return err
	}
	if err := s.Add("tombstone-purge", f.tombstoneSchedule, func(ctx context.Context) error {
		names, err := indexer.ManagedIndexes(ctx, es)
		if err != nil {
			return err
		}
		// One index failing must not keep the others' tombstones forever.
		var errs []error
		for _, n := range names {
			purged, err := indexer.PurgeTombstones(ctx, es, n, f.tombstoneHorizon)
			if err != nil {
				errs = append(errs, fmt.Errorf("index %s: %w", n, err))
				continue
			}
			slog.Info("tombstones purged", "index", n, "purged", purged, "horizon", f.tombstoneHorizon)
		}
		return errors.Join(errs...)
	}); err != nil {
		return err
	}
	if err := s.Add("deadletter-retry", f.deadletterRetrySchedule, func(ctx context.Context) error {
		n, err := relay.RetryDeadLetters(ctx, pool, schemaName, relay.DeadLetterFilter{Kind: relay.KindGaveUp}, "scheduler")
		if n > 0 {
			slog.Info("dead letters re-queued", "count", n)
		}
		return err
	}); err != nil {
		return err
	}
	// Without --reconcile-sql the index's document definition is the
	// truth; reconcile refuses an index that has neither, naming the flag.
	if f.reconcileSchedule != "" && f.reconcileIndex == "" {
		return errors.New("reconcile-schedule: needs --reconcile-index (and --reconcile-sql unless the index has a document definition)")
	}
	if f.reconcileSQLTimeout <= 0 {
		return fmt.Errorf("reconcile-sql-timeout: must be > 0, got %s", f.reconcileSQLTimeout)
	}
	return s.Add("reconcile", f.reconcileSchedule, func(ctx context.Context) error {
		rep, err := reconcile.Run(ctx, reconcile.Options{
			ES: es, DB: pool, Schema: schemaName, Index: f.reconcileIndex, SourceSQL: strings.TrimSpace(f.reconcileSQL),
			SourceTimeout: f.reconcileSQLTimeout, Apply: f.reconcileApply, Operator: "scheduler",
		})
		if err != nil {
			return err
		}
		slog.Info("reconcile finished", "index", f.reconcileIndex, "drifted", rep.Drifted(), "counts", rep.Counts, "fix_events", rep.Events)
		return nil
	})
}
