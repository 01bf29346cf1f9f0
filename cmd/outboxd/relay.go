package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/rebuild"
	"github.com/outboxd/outboxd/reconcile"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/webhook"
)

func init() {
	register("relay", "stream committed outbox events to Elasticsearch and messages to webhooks (with admin page and scheduled maintenance)", runRelay)
}

type relayFlags struct {
	partitions   int
	streamPrefix string
	indexes      string
	upgrade      bool

	batchDocs, batchBytes, prefetch  int
	inFlight                         int
	bulkDocs, bulkBytes, bulkWorkers int
	indexSpec                        string

	wakeup                  bool
	maxAttempts             int
	backoffBase, backoffMax time.Duration
	minPoll, maxPoll        time.Duration
	linger                  time.Duration
	lingerDocs              int
	memoryLimit             string
	lease, shutdown         time.Duration
	storeInterval           time.Duration
	adminAddr, adminToken   string
	adminHosts              listFlag
	retention               time.Duration
	retentionSchedule       string
	ledgerRetention         time.Duration
	tombstoneHorizon        time.Duration
	tombstoneSchedule       string
	deadletterRetrySchedule string
	reconcileSchedule       string
	reconcileIndex          string
	reconcileSQL            string
	reconcileApply          bool
	reconcileSQLTimeout     time.Duration
	jobTimeout              time.Duration
	abandonedAfter          time.Duration
	documentsTimeout        time.Duration
	destinations            destinationFlags
}

// destinationFlags collects the repeatable --destination flag.
type destinationFlags []string

func (d *destinationFlags) String() string { return strings.Join(*d, " ") }

func (d *destinationFlags) Set(v string) error {
	*d = append(*d, v)
	return nil
}

func runRelay(ctx context.Context, args []string) error {
	db, es, f, err := parseRelayFlags(args)
	if err != nil {
		return err
	}
	log := slog.Default()

	pool, err := relayPool(ctx, db, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for PostgreSQL
		}
		return err
	}
	defer pool.Close()
	esCfg, client, spec, err := connectElasticsearch(ctx, es, f)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r, err := newRelay(ctx, pool, db.schema, client, spec, f, reg, log)
	if err != nil {
		return err
	}
	limit, err := relayMemoryLimit(f.memoryLimit, f, len(r.Streams()))
	if err != nil {
		return err
	}
	applyMemoryLimit(limit, log)

	jobPool, err := newJobPool(ctx, pool)
	if err != nil {
		return err
	}
	defer jobPool.Close()
	sched := jobs.New(jobs.Config{Pool: jobPool, Schema: db.schema, Timeout: f.jobTimeout, Registerer: reg, Logger: log})
	if err := addJobs(sched, jobPool, client, db.schema, f); err != nil {
		return err
	}
	sched.Start()
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.shutdown)
		defer cancel()
		_ = sched.Stop(stopCtx)
	}()

	// nil without an admin server: then there is nothing to wait for.
	var adminErr chan error
	if f.adminAddr != "" {
		srv, err := newAdminServer(pool, db.schema, client, r, sched, f, reg, log)
		if err != nil {
			return err
		}
		log.Info("admin server listening", "addr", "http://"+srv.Addr()+"/")
		adminErr = make(chan error, 1)
		go func() { adminErr <- srv.Run(ctx) }()
	}

	if n, err := webhook.RequeueWaiting(ctx, pool, db.schema, destinationNames(f.destinations)); err != nil && ctx.Err() == nil {
		return err
	} else if n > 0 {
		log.Info("webhook: waiting messages appended again for their destination's stream", "messages", n)
	}
	log.Info("relay starting", "schema", db.schema, "elasticsearch", esCfg.String())
	if err := r.Run(ctx); err != nil {
		return err
	}
	if adminErr != nil {
		// The admin server stops within its own short grace.
		if err := <-adminErr; err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	log.Info("relay stopped")
	return nil
}

// relayPool connects the relay's pool. A PostgreSQL that does not answer
// yet (restarting, a connection cut at start) is waited for with backoff,
// logged: a relay never exits for a lost connection. A refused
// configuration (credentials, no such database) ends the command.
func relayPool(ctx context.Context, db *dbFlags, log *slog.Logger) (*pgxpool.Pool, error) {
	cfg, err := db.poolConfig()
	if err != nil {
		return nil, err
	}
	for failures := 1; ; failures++ {
		pool, err := connectPool(ctx, cfg)
		if err == nil {
			return pool, nil
		}
		if ctx.Err() != nil || relay.IsFatal(err) {
			return nil, err
		}
		wait := min(100*time.Millisecond<<min(failures-1, 8), 10*time.Second)
		log.Warn("cannot connect to PostgreSQL at start; retrying", "failures", failures, "retry_in", wait, "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

const relayUsage = "Usage: outboxd relay [--config outboxd.yaml] [flags]\n\nStreams committed outbox events to Elasticsearch, and messages to the webhook destinations\ngiven with --destination (each on a stream of its own). Several relays may run against one\ndatabase: each stream has one leader at a time, the others stand by. At start it checks what\n`outboxd check` checks and refuses what cannot work.\n\nFlags:"

func parseRelayFlags(args []string) (*dbFlags, *esFlags, relayFlags, error) {
	return parseRelayFlagSet("relay", relayUsage, args)
}

// parseRelayFlagSet parses the relay's flags, for relay and for check
// (name), which take the same.
func parseRelayFlagSet(name, usage string, args []string) (*dbFlags, *esFlags, relayFlags, error) {
	fs, db, es, fp := newRelayFlagSet(name, usage)
	err := parseFlags(fs, args)
	f := *fp
	if err != nil {
		return nil, nil, f, err
	}
	if fs.NArg() > 0 {
		return nil, nil, f, fmt.Errorf("unexpected argument %q (%s takes only flags)", fs.Arg(0), name)
	}
	if err := checkRelayFlags(f); err != nil {
		return nil, nil, f, locate(fs, err)
	}
	return db, es, f, nil
}

func newRelayFlagSet(name, usage string) (*flag.FlagSet, *dbFlags, *esFlags, *relayFlags) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), usage)
		fs.PrintDefaults()
	}
	db := addDBFlags(fs)
	es := addESFlags(fs)
	f := &relayFlags{}
	fs.IntVar(&f.partitions, "partitions", 1, "split the outbox into N streams by hash of source_id; relays share them fairly")
	fs.StringVar(&f.streamPrefix, "stream", "default", "stream name (prefix of partition names)")
	fs.StringVar(&f.indexes, "indexes", "", "only deliver events for these index names (comma-separated; default all)")
	fs.BoolVar(&f.upgrade, "upgrade-layouts", true, "at start, upgrade the indexes of earlier releases (those in --indexes, or every one outboxd manages) to the current alias layout, in the background")
	fs.IntVar(&f.batchDocs, "batch-docs", 8000, "events per page read from the outbox and handed to the sink")
	fs.StringVar(&f.memoryLimit, "memory-limit", "auto", "soft memory limit of the process (the Go runtime's GOMEMLIMIT, which wins when set): a size such as 512MiB, off, or auto: 32 MiB + per stream (prefetch + 2 x in-flight + 1) x batch-bytes")
	fs.IntVar(&f.batchBytes, "batch-bytes", 4<<20, "bytes per page; a page ends with the event that reaches this, so it may exceed it by one event. Events held per stream led: up to (prefetch + in-flight + 1) x (batch-bytes + largest event), plus the sink's bulk bodies")
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
	fs.DurationVar(&f.linger, "linger", 60*time.Millisecond, "how long a page read at a low rate may wait for more events before it goes to Elasticsearch, so a trickle makes fewer, larger bulk requests; a backlog never waits; 0 disables")
	fs.IntVar(&f.lingerDocs, "linger-docs", 27, "a lingering page goes at once when it holds this many events")
	fs.BoolVar(&f.wakeup, "wakeup", false, "also wake on NOTIFY from the outbox (enable with SELECT <schema>.enable_wakeup()); adds a NOTIFY per writing transaction")
	fs.DurationVar(&f.storeInterval, "store-interval", 100*time.Millisecond, "how often progress is stored while events flow (a crash re-delivers at most this much)")
	fs.DurationVar(&f.lease, "lease-interval", time.Second, "how often a standby tries to take over a stream")
	fs.DurationVar(&f.shutdown, "shutdown-timeout", 10*time.Second, "grace for in-flight writes after the first signal")
	fs.StringVar(&f.adminAddr, "admin-addr", admin.DefaultAddr, "admin HTTP address (dashboard, /metrics, /healthz, /readyz); empty disables")
	fs.StringVar(&f.adminToken, "admin-token", "", "bearer token required by the admin server (prefer env OUTBOXD_ADMIN_TOKEN)")
	fs.Var(&f.adminHosts, "admin-host", "a `NAME` the admin server answers to without --admin-token, besides its own address (DNS rebinding protection); repeatable or comma-separated, e.g. relay-1,relay-1.internal:9464")
	fs.DurationVar(&f.retention, "retention", 7*24*time.Hour, "keep acknowledged events this long (for replay) before deleting them")
	fs.StringVar(&f.retentionSchedule, "retention-schedule", "@every 10m", "when to delete acknowledged events past retention, and final ledger rows past --ledger-retention (cron or @every; empty disables)")
	fs.DurationVar(&f.ledgerRetention, "ledger-retention", webhook.DefaultLedgerRetention, "keep final webhook ledger rows (delivered, failed, skipped; payload included) this long after they finished; at least --retention, since the ledger is what stops a replayed message from being sent twice")
	fs.DurationVar(&f.tombstoneHorizon, "tombstone-horizon", 30*24*time.Hour, "purge delete tombstones older than this; keep it longer than any replay window")
	fs.StringVar(&f.tombstoneSchedule, "tombstone-purge-schedule", "@every 1h", "when to purge old tombstones (empty disables)")
	fs.StringVar(&f.deadletterRetrySchedule, "deadletter-retry-schedule", "", "when to re-queue dead letters that ran out of transient retries (empty disables)")
	fs.StringVar(&f.reconcileSchedule, "reconcile-schedule", "", "when to run reconcile (needs --reconcile-index and --reconcile-sql; empty disables)")
	fs.StringVar(&f.reconcileIndex, "reconcile-index", "", "index name the scheduled reconcile checks")
	fs.StringVar(&f.reconcileSQL, "reconcile-sql", "", "SQL returning source_id, version, document for the scheduled reconcile")
	fs.BoolVar(&f.reconcileApply, "reconcile-apply", false, "let the scheduled reconcile append fix events (default: report only)")
	fs.DurationVar(&f.reconcileSQLTimeout, "reconcile-sql-timeout", reconcile.DefaultSourceTimeout, "statement timeout of --reconcile-sql, which runs in a READ ONLY transaction")
	fs.DurationVar(&f.jobTimeout, "job-timeout", 5*time.Minute, "deadline of one scheduled job run; a run still going then is cancelled and recorded as failed")
	fs.DurationVar(&f.abandonedAfter, "abandoned-after", relay.DefaultAbandonedAfter, "the admin page flags a stream as abandoned when it has no leader and no progress for this long")
	fs.DurationVar(&f.documentsTimeout, "documents-timeout", documents.DefaultReadTimeout, "statement timeout of a definition-fed index's SQL when the relay reads the documents of a page's refreshes (READ ONLY)")
	fs.Var(&f.destinations, "destination", "deliver messages for a webhook destination (repeatable): NAME=URL[,secret_env=VAR][,previous_secret_env=VAR[,previous_secret_until=T]][,ca_file=PEM][,idempotent=true][,timeout=5s][,concurrency=N][,rate=N/s][,check=SQL] (check last)")
	return fs, db, es, f
}

// checkRelayFlags refuses values no relay can run with. Each error starts
// with the flag's name, which locate turns into the file's key and line.
func checkRelayFlags(f relayFlags) error {
	if _, err := relayMemoryLimit(f.memoryLimit, f, 1); err != nil {
		return err
	}
	if f.linger < 0 {
		return fmt.Errorf("linger: must be >= 0, got %v", f.linger)
	}
	if f.jobTimeout <= 0 {
		return fmt.Errorf("job-timeout: must be > 0, got %v", f.jobTimeout)
	}
	if f.ledgerRetention < f.retention {
		return fmt.Errorf("ledger-retention: %v is shorter than --retention %v: a message replayed from the outbox after its ledger row is gone would be sent again", f.ledgerRetention, f.retention)
	}
	if f.documentsTimeout <= 0 {
		return fmt.Errorf("documents-timeout: must be > 0, got %v", f.documentsTimeout)
	}
	if f.abandonedAfter <= 0 {
		return fmt.Errorf("abandoned-after: must be > 0, got %v", f.abandonedAfter)
	}
	return nil
}

// connectElasticsearch builds the client and refuses, before any event is
// taken, a server or an index spec that cannot work; a server that does
// not answer yet is not refused (the relay reports the outage and waits).
func connectElasticsearch(ctx context.Context, es *esFlags, f relayFlags) (indexer.ClientConfig, *elasticsearch.Client, []byte, error) {
	esCfg, err := es.config()
	if err != nil {
		return esCfg, nil, nil, err
	}
	client, err := indexer.NewClient(esCfg)
	if err != nil {
		return esCfg, nil, nil, err
	}
	checkCtx, cancelCheck := context.WithTimeout(ctx, 15*time.Second)
	err = indexer.CheckServer(checkCtx, client)
	cancelCheck()
	if err != nil {
		return esCfg, nil, nil, fmt.Errorf("elasticsearch: %w", err)
	}
	var spec []byte
	if f.indexSpec != "" {
		if spec, err = os.ReadFile(f.indexSpec); err != nil {
			return esCfg, nil, nil, fmt.Errorf("index-spec: %w", err)
		}
		if err := checkIndexSpec(ctx, client, spec, len(esCfg.Addresses)); err != nil {
			return esCfg, nil, nil, fmt.Errorf("index-spec %s: %w", f.indexSpec, err)
		}
	}
	return esCfg, client, spec, nil
}

// newRelay wires the Elasticsearch sink (behind the definition sink, which
// answers the refreshes of definition-fed indexes with their documents
// and passes every other event through), the streams (partitions of the
// outbox, and one per webhook destination) and the engine.
func newRelay(ctx context.Context, pool *pgxpool.Pool, schemaName string, client *elasticsearch.Client, spec []byte, f relayFlags, reg *prometheus.Registry, log *slog.Logger) (*relay.Relay, error) {
	sink, err := indexer.NewSink(indexer.Options{
		Client: client, MaxBatchDocs: f.bulkDocs, MaxBatchBytes: f.bulkBytes, Workers: f.bulkWorkers,
		IndexSpec: spec, JSONB: true, Registerer: reg, Logger: log, Rebuilt: rebuild.Home(pool, schemaName),
	})
	if err != nil {
		return nil, err
	}
	docs, err := documents.NewSink(documents.SinkOptions{Pool: pool, Schema: schemaName, Next: sink, ReadTimeout: f.documentsTimeout, Registerer: reg, Logger: log})
	if err != nil {
		return nil, err
	}
	if f.upgrade {
		go upgradeLayouts(ctx, client, indexer.SplitAddresses(f.indexes), log)
	}
	streams, err := relay.Partitions(f.streamPrefix, f.partitions)
	if err != nil {
		return nil, err
	}
	for i := range streams {
		if f.indexes != "" {
			streams[i].Indexes = indexer.SplitAddresses(f.indexes)
		}
		// Messages have sinks of their own; Elasticsearch never sees them.
		streams[i].Exclude = []string{outbox.MessagePrefix + "*"}
	}
	hooks, err := messageStreams(pool, schemaName, f.destinations, reg, log)
	if err != nil {
		return nil, err
	}
	return relay.New(relay.Config{
		Pool: pool, Schema: schemaName, Sink: docs, Streams: append(streams, hooks...),
		MaxBatchDocs: f.batchDocs, MaxBatchBytes: f.batchBytes, Prefetch: f.prefetch, InFlight: f.inFlight,
		MinPollInterval: f.minPoll, MaxPollInterval: f.maxPoll, Linger: lingerOf(f.linger), LingerDocs: f.lingerDocs,
		MaxAttempts: f.maxAttempts, BackoffBase: f.backoffBase, BackoffMax: f.backoffMax,
		LeaseInterval: f.lease, ShutdownTimeout: f.shutdown, Wakeup: f.wakeup, StoreInterval: f.storeInterval,
		Registerer: reg, Logger: log,
	})
}

// lingerOf maps --linger to relay.Config, where zero means the default.
func lingerOf(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// newAdminServer binds the admin server: dashboard, /metrics, /readyz.
func newAdminServer(pool *pgxpool.Pool, schemaName string, client *elasticsearch.Client, r *relay.Relay, sched *jobs.Scheduler, f relayFlags, reg *prometheus.Registry, log *slog.Logger) (*admin.Server, error) {
	return admin.New(admin.Config{
		Addr: f.adminAddr, Token: f.adminToken, Hosts: f.adminHosts, Gatherer: reg,
		Stats: func(ctx context.Context) (*relay.Stats, error) {
			st, err := statsWithPaused(ctx, pool, schemaName, r)
			if err == nil {
				st.MarkAbandoned(f.abandonedAfter)
			}
			return st, err
		},
		Ready: map[string]func(context.Context) error{
			"postgres":      func(ctx context.Context) error { return pool.Ping(ctx) },
			"elasticsearch": func(ctx context.Context) error { return indexer.Ping(ctx, client) },
			"sink":          func(context.Context) error { return pausedError(r) },
			"relay":         func(context.Context) error { return r.Health() },
			"leaders":       r.LeaderlessError,
		},
		Role: admin.RoleOf(r), Jobs: sched.Status, Logger: log, Redact: secrets.String,
		Rebuilds: func(ctx context.Context) ([]rebuild.Status, error) {
			return rebuild.Unfinished(ctx, pool, schemaName)
		},
	})
}

// listFlag is a repeatable flag whose values may also be comma-separated.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, indexer.SplitAddresses(v)...)
	return nil
}

// messageStreams gives each --destination a stream and sink of its own (a
// slow receiver holds back only its own messages) and, on every relay, the
// unrouted stream that records as waiting the messages of destinations no
// live relay serves: every committed message gets a ledger row, whatever
// the relays' flags. The ledger's gauges go on /metrics.
func messageStreams(pool *pgxpool.Pool, schemaName string, specs []string, reg *prometheus.Registry, log *slog.Logger) ([]relay.Stream, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(webhook.NewLedgerCollector(pool, id))
	m := webhook.NewMetrics(reg)
	var out []relay.Stream
	var names []string
	for _, spec := range specs {
		d, err := webhook.ParseDestination(spec, nil)
		if err != nil {
			return nil, fmt.Errorf("destination: %w", err)
		}
		if slices.Contains(names, d.Name) {
			return nil, fmt.Errorf("destination: %s: listed twice", d.Name)
		}
		sink, err := webhook.NewSink(webhook.Options{Pool: pool, Schema: schemaName, Destination: d, Metrics: m, Logger: log})
		if err != nil {
			return nil, err
		}
		log.Info("webhook destination", "destination", d.String())
		names = append(names, d.Name)
		out = append(out, relay.Stream{Name: messageStream(d.Name), BucketHi: 1023, Indexes: []string{outbox.MessageIndex(d.Name)}, Sink: sink})
	}
	unrouted, err := webhook.NewUnroutedSink(pool, schemaName, names, m)
	if err != nil {
		return nil, err
	}
	unrouted.SetServed(func(ctx context.Context, dests []string) (map[string]bool, error) {
		streams := make([]string, len(dests))
		for i, d := range dests {
			streams[i] = messageStream(d)
		}
		led, err := relay.Served(ctx, pool, schemaName, streams)
		if err != nil {
			return nil, err
		}
		out := make(map[string]bool, len(dests))
		for _, d := range dests {
			out[d] = led[messageStream(d)]
		}
		return out, nil
	})
	return append(out, relay.Stream{Name: "webhook-unrouted", BucketHi: 1023, Indexes: []string{outbox.MessagePrefix + "*"}, Sink: unrouted}), nil
}

// messageStream is the name of a destination's stream.
func messageStream(destination string) string { return "webhook-" + destination }

// destinationNames are the names of the --destination flags.
func destinationNames(specs []string) []string {
	var names []string
	for _, spec := range specs {
		if name, _, ok := strings.Cut(spec, "="); ok {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names
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
	if f.reconcileSchedule != "" && (f.reconcileIndex == "" || strings.TrimSpace(f.reconcileSQL) == "") {
		return errors.New("reconcile-schedule: needs --reconcile-index and --reconcile-sql")
	}
	if f.reconcileSQLTimeout <= 0 {
		return fmt.Errorf("reconcile-sql-timeout: must be > 0, got %s", f.reconcileSQLTimeout)
	}
	return s.Add("reconcile", f.reconcileSchedule, func(ctx context.Context) error {
		rep, err := reconcile.Run(ctx, reconcile.Options{
			ES: es, DB: pool, Schema: schemaName, Index: f.reconcileIndex, SourceSQL: f.reconcileSQL,
			SourceTimeout: f.reconcileSQLTimeout, Apply: f.reconcileApply, Operator: "scheduler",
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
