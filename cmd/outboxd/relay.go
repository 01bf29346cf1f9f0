package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/relay"
)

func init() {
	register("relay", "stream committed outbox events to Elasticsearch (with admin page and scheduled maintenance)", runRelay)
}

type relayFlags struct {
	partitions   int
	streamPrefix string
	indexes      string

	batchDocs, batchBytes, prefetch  int
	inFlight                         int
	bulkDocs, bulkBytes, bulkWorkers int
	indexSpec                        string

	wakeup                  bool
	maxAttempts             int
	backoffBase, backoffMax time.Duration
	minPoll, maxPoll        time.Duration
	lease, shutdown         time.Duration
	storeInterval           time.Duration
	adminAddr, adminToken   string
	retention               time.Duration
	retentionSchedule       string
	tombstoneHorizon        time.Duration
	tombstoneSchedule       string
	deadletterRetrySchedule string
	reconcileSchedule       string
	reconcileIndex          string
	reconcileSQL            string
	reconcileApply          bool
}

func runRelay(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: outboxd relay [flags]\n\nStreams committed outbox events to Elasticsearch. Several relays may run against one\ndatabase: each stream has one leader at a time, the others stand by.\n\nFlags:")
		fs.PrintDefaults()
	}
	db := addDBFlags(fs)
	es := addESFlags(fs)
	f := relayFlags{}
	fs.IntVar(&f.partitions, "partitions", 1, "split the outbox into N streams by hash of source_id; relays share them fairly")
	fs.StringVar(&f.streamPrefix, "stream", "default", "stream name (prefix of partition names)")
	fs.StringVar(&f.indexes, "indexes", "", "only deliver events for these index names (comma-separated; default all)")
	fs.IntVar(&f.batchDocs, "batch-docs", 8000, "events per page read from the outbox and handed to the sink")
	fs.IntVar(&f.batchBytes, "batch-bytes", 8<<20, "bytes per page; a page ends with the event that reaches this, so it may exceed it by one event. Events held per stream led: up to (prefetch + in-flight + 1) x (batch-bytes + largest event), plus the sink's bulk bodies")
	fs.IntVar(&f.prefetch, "prefetch", 2, "pages read ahead of the sink (memory: see --batch-bytes)")
	fs.IntVar(&f.inFlight, "in-flight", 3, "pages at the sink at once; acknowledged in order (memory: see --batch-bytes)")
	fs.IntVar(&f.bulkDocs, "bulk-docs", 1000, "documents per Elasticsearch bulk request")
	fs.IntVar(&f.bulkBytes, "bulk-bytes", 5<<20, "bytes per Elasticsearch bulk request")
	fs.IntVar(&f.bulkWorkers, "bulk-workers", 4, "bulk requests in flight")
	fs.StringVar(&f.indexSpec, "index-spec", "", "JSON file with {\"settings\":...,\"mappings\":...} for new indices (default: 1 shard, 0 replicas, dynamic mappings)")
	fs.IntVar(&f.maxAttempts, "max-attempts", 10, "transient failures per event before it is dead-lettered")
	fs.DurationVar(&f.backoffBase, "backoff-base", 100*time.Millisecond, "first retry delay (doubles, with jitter)")
	fs.DurationVar(&f.backoffMax, "backoff-max", 30*time.Second, "longest retry delay")
	fs.DurationVar(&f.minPoll, "min-poll", 2*time.Millisecond, "first wait after an empty poll")
	fs.DurationVar(&f.maxPoll, "max-poll", 100*time.Millisecond, "longest wait between polls when idle")
	fs.BoolVar(&f.wakeup, "wakeup", false, "also wake on NOTIFY from the outbox (enable with SELECT <schema>.enable_wakeup()); adds a NOTIFY per writing transaction")
	fs.DurationVar(&f.storeInterval, "store-interval", 100*time.Millisecond, "how often progress is stored while events flow (a crash re-delivers at most this much)")
	fs.DurationVar(&f.lease, "lease-interval", time.Second, "how often a standby tries to take over a stream")
	fs.DurationVar(&f.shutdown, "shutdown-timeout", 10*time.Second, "grace for in-flight writes after the first signal")
	fs.StringVar(&f.adminAddr, "admin-addr", admin.DefaultAddr, "admin HTTP address (dashboard, /metrics, /healthz, /readyz); empty disables")
	fs.StringVar(&f.adminToken, "admin-token", "", "bearer token required by the admin server (prefer env OUTBOXD_ADMIN_TOKEN)")
	fs.DurationVar(&f.retention, "retention", 7*24*time.Hour, "keep acknowledged events this long (for replay) before deleting them")
	fs.StringVar(&f.retentionSchedule, "retention-schedule", "@every 10m", "when to delete acknowledged events past retention (cron or @every; empty disables)")
	fs.DurationVar(&f.tombstoneHorizon, "tombstone-horizon", 30*24*time.Hour, "purge delete tombstones older than this; keep it longer than any replay window")
	fs.StringVar(&f.tombstoneSchedule, "tombstone-purge-schedule", "@every 1h", "when to purge old tombstones (empty disables)")
	fs.StringVar(&f.deadletterRetrySchedule, "deadletter-retry-schedule", "", "when to re-queue dead letters that ran out of transient retries (empty disables)")
	fs.StringVar(&f.reconcileSchedule, "reconcile-schedule", "", "when to run reconcile (needs --reconcile-index and --reconcile-sql; empty disables)")
	fs.StringVar(&f.reconcileIndex, "reconcile-index", "", "index name the scheduled reconcile checks")
	fs.StringVar(&f.reconcileSQL, "reconcile-sql", "", "SQL returning source_id, version, document for the scheduled reconcile")
	fs.BoolVar(&f.reconcileApply, "reconcile-apply", false, "let the scheduled reconcile append fix events (default: report only)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log := slog.Default()

	pool, err := db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	esCfg, err := es.config()
	if err != nil {
		return err
	}
	client, err := indexer.NewClient(esCfg)
	if err != nil {
		return err
	}
	// An unsupported server is refused before any event is taken; one that
	// does not answer yet is not (the relay reports the outage and waits).
	checkCtx, cancelCheck := context.WithTimeout(ctx, 15*time.Second)
	err = indexer.CheckServer(checkCtx, client)
	cancelCheck()
	if err != nil {
		return fmt.Errorf("elasticsearch: %w", err)
	}
	var spec []byte
	if f.indexSpec != "" {
		if spec, err = os.ReadFile(f.indexSpec); err != nil {
			return fmt.Errorf("index-spec: %w", err)
		}
		// Checked by the server before any event is taken: a spec it will
		// not create would otherwise surface only at the first event.
		if err := checkIndexSpec(ctx, client, spec, len(esCfg.Addresses)); err != nil {
			return fmt.Errorf("index-spec %s: %w", f.indexSpec, err)
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	sink, err := indexer.NewSink(indexer.Options{
		Client: client, MaxBatchDocs: f.bulkDocs, MaxBatchBytes: f.bulkBytes, Workers: f.bulkWorkers,
		IndexSpec: spec, Registerer: reg, Logger: log,
	})
	if err != nil {
		return err
	}
	upgradeLayouts(ctx, client, log)
	streams, err := relay.Partitions(f.streamPrefix, f.partitions)
	if err != nil {
		return err
	}
	if f.indexes != "" {
		idx := indexer.SplitAddresses(f.indexes)
		for i := range streams {
			streams[i].Indexes = idx
		}
	}
	r, err := relay.New(relay.Config{
		Pool: pool, Schema: db.schema, Sink: sink, Streams: streams,
		MaxBatchDocs: f.batchDocs, MaxBatchBytes: f.batchBytes, Prefetch: f.prefetch, InFlight: f.inFlight,
		MinPollInterval: f.minPoll, MaxPollInterval: f.maxPoll,
		MaxAttempts: f.maxAttempts, BackoffBase: f.backoffBase, BackoffMax: f.backoffMax,
		LeaseInterval: f.lease, ShutdownTimeout: f.shutdown, Wakeup: f.wakeup, StoreInterval: f.storeInterval,
		Registerer: reg, Logger: log,
	})
	if err != nil {
		return err
	}

	sched := jobs.New(jobs.Config{Pool: pool, Schema: db.schema, Registerer: reg, Logger: log})
	if err := addJobs(sched, pool, client, db.schema, f); err != nil {
		return err
	}
	sched.Start()
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.shutdown)
		defer cancel()
		_ = sched.Stop(stopCtx)
	}()

	adminErr := make(chan error, 1)
	if f.adminAddr != "" {
		srv, err := admin.New(admin.Config{
			Addr: f.adminAddr, Token: f.adminToken, Gatherer: reg,
			Stats: func(ctx context.Context) (*relay.Stats, error) { return statsWithPaused(ctx, pool, db.schema, r) },
			Ready: map[string]func(context.Context) error{
				"postgres":      func(ctx context.Context) error { return pool.Ping(ctx) },
				"elasticsearch": func(ctx context.Context) error { return indexer.Ping(ctx, client) },
				"sink":          func(context.Context) error { return pausedError(r) },
			},
			Role: admin.RoleOf(r), Jobs: sched.Status, Logger: log, Redact: secrets.String,
		})
		if err != nil {
			return err
		}
		log.Info("admin server listening", "addr", "http://"+srv.Addr()+"/")
		go func() { adminErr <- srv.Run(ctx) }()
	}

	log.Info("relay starting", "schema", db.schema, "streams", len(streams), "elasticsearch", esCfg.String())
	err = r.Run(ctx)
	if err != nil {
		return err
	}
	select {
	case err := <-adminErr:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	case <-time.After(f.shutdown):
	}
	log.Info("relay stopped")
	return nil
}

// checkIndexSpec asks up to one node per address: a request that cannot
// reach its node sets that node aside, so the next goes to another, and one
// dead node of a cluster does not stop the relay from starting.
func checkIndexSpec(ctx context.Context, client *elasticsearch.Client, spec []byte, nodes int) error {
	for i := 1; ; i++ {
		err := indexer.CheckIndexSpec(ctx, client, spec)
		var re *indexer.ResponseError
		if err == nil || errors.As(err, &re) || i >= nodes || ctx.Err() != nil {
			return err
		}
	}
}

func addJobs(s *jobs.Scheduler, pool *pgxpool.Pool, es *elasticsearch.Client, schemaName string, f relayFlags) error {
	if err := s.Add("outbox-retention", f.retentionSchedule, func(ctx context.Context) error {
		n, err := relay.DeleteAcknowledged(ctx, pool, schemaName, f.retention, 5000)
		slog.Info("retention: deleted acknowledged events", "deleted", n, "retention", f.retention)
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
		n, err := relay.RetryDeadLetters(ctx, pool, schemaName, relay.DeadLetterFilter{ReasonContains: "gave up after"}, "scheduler")
		if n > 0 {
			slog.Info("dead letters re-queued", "count", n)
		}
		return err
	}); err != nil {
		return err
	}
	if f.reconcileSchedule != "" && (f.reconcileIndex == "" || strings.TrimSpace(f.reconcileSQL) == "") {
		return errors.New("reconcile-schedule: needs --reconcile-index and --reconcile-sql")
	}
	return s.Add("reconcile", f.reconcileSchedule, func(ctx context.Context) error {
		rep, err := indexer.Reconcile(ctx, indexer.ReconcileOptions{
			ES: es, DB: pool, Schema: schemaName, Index: f.reconcileIndex, SourceSQL: f.reconcileSQL,
			Apply: f.reconcileApply, Operator: "scheduler",
		})
		if err != nil {
			return err
		}
		slog.Info("reconcile finished", "index", f.reconcileIndex, "drifted", rep.Drifted(), "counts", rep.Counts, "fix_events", rep.Events)
		return nil
	})
}

// statsWithPaused adds to the outbox's figures why this process's streams
// are paused, if they are.
func statsWithPaused(ctx context.Context, pool *pgxpool.Pool, schemaName string, r *relay.Relay) (*relay.Stats, error) {
	st, err := relay.CollectStats(ctx, pool, schemaName)
	if err != nil {
		return nil, err
	}
	paused := r.Paused()
	for i := range st.Streams {
		st.Streams[i].Paused = paused[st.Streams[i].Stream]
	}
	return st, nil
}

// pausedError makes /readyz not ready while a stream's sink writes fail as
// a whole: Elasticsearch may answer pings and still refuse every bulk.
func pausedError(r *relay.Relay) error {
	paused := r.Paused()
	if len(paused) == 0 {
		return nil
	}
	names := make([]string, 0, len(paused))
	for s := range paused {
		names = append(names, s)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, s := range names {
		parts[i] = "stream " + s + " paused: " + paused[s]
	}
	return errors.New(strings.Join(parts, "; "))
}
