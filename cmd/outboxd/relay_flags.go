package main

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/reconcile"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/webhook"
)

// relayFlags are the settings of outboxd relay and outboxd check, from the
// command line, the --config file and the environment (parseFlags).
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
	quietAfter, quietPoll   time.Duration
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
	fs.StringVar(&f.memoryLimit, "memory-limit", "auto", "soft memory limit of the process (the Go runtime's GOMEMLIMIT, which wins when set): a size such as 512MiB, off, or auto: 32 MiB + per stream (prefetch + 2 x in-flight + 1) x its page bytes (batch-bytes; at most 1 MiB for the unrouted message stream)")
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
	fs.DurationVar(&f.quietAfter, "quiet-after", 10*time.Second, "a stream that has read no event for this long polls at most every --quiet-poll")
	fs.DurationVar(&f.quietPoll, "quiet-poll", 250*time.Millisecond, "longest wait between polls once a stream is quiet (--quiet-after): the first event after a quiet spell waits up to this long, unless --wakeup; at or below --max-poll, polls stay at --max-poll")
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
	fs.StringVar(&f.reconcileSchedule, "reconcile-schedule", "", "when to run reconcile (needs --reconcile-index, and --reconcile-sql unless that index has a document definition; empty disables)")
	fs.StringVar(&f.reconcileIndex, "reconcile-index", "", "index name the scheduled reconcile checks")
	fs.StringVar(&f.reconcileSQL, "reconcile-sql", "", "SQL returning source_id, version, document for the scheduled reconcile (empty: the index's document definition)")
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
	if _, err := relayMemoryLimit(f.memoryLimit, f, []int{f.batchBytes}); err != nil {
		return err
	}
	if f.batchBytes < 1 {
		return fmt.Errorf("batch-bytes: must be >= 1, got %d", f.batchBytes)
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

// lingerOf maps --linger to relay.Config, where zero means the default.
func lingerOf(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// listFlag is a repeatable flag whose values may also be comma-separated.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, indexer.SplitAddresses(v)...)
	return nil
}
