package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// config holds every knob of a run. Each flag can also be set as
// BENCH_<FLAG> in the environment (dashes become underscores); the
// command line wins.
type config struct {
	scenarios string

	pageDocs int // relay MaxBatchDocs
	prefetch int

	loadTx      int // events per loading transaction
	loadWorkers int

	drainN    int
	naiveN    int
	naiveTime time.Duration
	peerN     int

	walN      int
	walRepeat int

	latRate     int
	latDuration time.Duration
	latWarmup   time.Duration
	latWorkers  int

	rssSizes string

	e2eN        int
	e2eNaiveN   int
	e2ePageDocs int
	e2eRounds   int
	bulkDocs    int
	bulkWorkers int

	outboxd   string
	relayArgs string

	writersConns  int
	writersPhase  time.Duration
	writersRounds int

	pgbench        string
	pgbenchScale   int
	pgbenchClients int
	pgbenchThreads int
	pgbenchPhase   time.Duration
	pgbenchRounds  int

	lowDuration  time.Duration
	lowWorkers   int
	highWorkers  int
	idleDuration time.Duration
	idleSettle   time.Duration

	memN        int
	memDocKB    int
	memRate     int
	memDuration time.Duration
	memBigMB    int

	shutdownN int

	backfillN        int
	backfillBatch    int
	backfillInFlight int
	backfillRepeat   int

	backfillMemKBN    int
	backfillMemMBN    int
	backfillMemPeakMB int

	documentsN        int
	documentsChildren int
	documentsFanout   int
	documentsBatch    int

	profileDir string
	childGOGC  string
	keep       bool
}

var scenarioNames = []string{"drain", "wal", "latency", "rss", "e2e", "writers", "pgbench", "lowrate", "idle", "memory", "shutdown", "backfill", "backfillmem", "documents"}

func parseConfig(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: benchharness run [flags]\n\nEvery flag can also be set as BENCH_<FLAG> (e.g. BENCH_DRAIN_N=1000000).\nScenarios: drain, wal, latency, rss, e2e, writers, pgbench, lowrate, idle, memory, shutdown, backfill, backfillmem, documents (comma-separated, or all).\n\nFlags:")
		fs.PrintDefaults()
	}
	str := func(p *string, name, def, usage string) { fs.StringVar(p, name, envString(name, def), usage) }
	num := func(p *int, name string, def int, usage string) { fs.IntVar(p, name, envInt(name, def), usage) }
	dur := func(p *time.Duration, name string, def time.Duration, usage string) {
		fs.DurationVar(p, name, envDuration(name, def), usage)
	}
	str(&c.scenarios, "scenarios", "all", "scenarios to run: "+strings.Join(scenarioNames, ",")+" or all")
	num(&c.pageDocs, "page-docs", 2000, "relay page size (MaxBatchDocs) for the no-op drains")
	num(&c.prefetch, "prefetch", 2, "relay Prefetch")
	num(&c.loadTx, "load-tx", 1000, "events per transaction when loading a backlog")
	num(&c.loadWorkers, "load-workers", 2, "parallel loading connections")
	num(&c.drainN, "drain-n", 200_000, "drain: backlog size for the relay")
	num(&c.naiveN, "naive-n", 10_000, "drain: backlog size for the naive one-event-per-transaction relay")
	dur(&c.naiveTime, "naive-time", 15*time.Second, "drain: stop the naive relay after this long and report its rate so far")
	num(&c.peerN, "peer-n", 200_000, "drain: backlog size for the claim-and-DELETE batch loop (0 skips it)")
	num(&c.walN, "wal-n", 200_000, "wal: backlog size")
	num(&c.walRepeat, "wal-repeat", 3, "wal: drains of the same backlog; the minimum is reported (other writers only add WAL)")
	num(&c.latRate, "lat-rate", 1000, "latency: events per second, one per transaction")
	dur(&c.latDuration, "lat-duration", 20*time.Second, "latency: measured time per phase (the recorded run: 60s)")
	dur(&c.latWarmup, "lat-warmup", 2*time.Second, "latency: events produced before measuring")
	num(&c.latWorkers, "lat-workers", 24, "latency: producer connections the paced ticker hands events to")
	str(&c.rssSizes, "rss-sizes", "200000,1000000", "rss: backlog sizes drained by a relay child process (recorded run: 1000000,5000000)")
	num(&c.e2eN, "e2e-n", 1_000_000, "e2e: documents through outbox -> relay -> Elasticsearch and through the loaders (the goal's size)")
	num(&c.e2eNaiveN, "e2e-naive-n", 1_000, "e2e: documents through the naive one-request-per-event sink")
	num(&c.e2ePageDocs, "e2e-page-docs", 4000, "e2e: relay page size; bulk-docs x bulk-workers keeps every worker busy")
	num(&c.e2eRounds, "e2e-rounds", 3, "e2e: rounds of relay, hand-written loader and raw loader, one after the other, each first once in three; the ratios' median is the verdict (the goal's: 3)")
	num(&c.bulkDocs, "bulk-docs", 1000, "e2e, backfill: documents per bulk request (sink and loaders alike)")
	num(&c.bulkWorkers, "bulk-workers", 4, "e2e, backfill: bulk requests in flight (sink and loaders alike)")
	str(&c.outboxd, "outboxd", "bin/outboxd", "the outboxd binary that the lowrate, idle, memory, shutdown and backfill scenarios run (scripts/bench builds it)")
	str(&c.relayArgs, "relay-args", "", "extra flags for every outboxd relay child, space-separated (e.g. \"--batch-docs 2000 --max-poll 200ms\")")
	num(&c.writersConns, "writers-conns", 8, "writers: client connections, one business transaction at a time each")
	dur(&c.writersPhase, "writers-phase", 5*time.Second, "writers: length of each phase (plain, Append, Queue, capture)")
	num(&c.writersRounds, "writers-rounds", 2, "writers: alternations of the phases (>= 2)")
	str(&c.pgbench, "pgbench", "", "pgbench: the pgbench binary (default: the server's BINDIR, then PATH)")
	num(&c.pgbenchScale, "pgbench-scale", 10, "pgbench: scale factor of pgbench -i (100,000 accounts and 1 branch per unit)")
	num(&c.pgbenchClients, "pgbench-clients", 8, "pgbench: clients (-c)")
	num(&c.pgbenchThreads, "pgbench-threads", 2, "pgbench: threads (-j)")
	dur(&c.pgbenchPhase, "pgbench-phase", 10*time.Second, "pgbench: length of each phase (-T; plain, hand-written INSERT, append, append with a version)")
	num(&c.pgbenchRounds, "pgbench-rounds", 3, "pgbench: alternations of the phases")
	dur(&c.lowDuration, "lowrate-duration", 20*time.Second, "lowrate: paced production per rate (500, 1000, 5000 events/s; the recorded run: 60s)")
	num(&c.lowWorkers, "lowrate-workers", 8, "lowrate: producer connections, one event per transaction")
	num(&c.highWorkers, "lowrate-high-workers", 24, "lowrate, memory: producer connections for rates above 1,000/s (8 commit about 2,000 single-event transactions/s here)")
	dur(&c.idleDuration, "idle-duration", 20*time.Second, "idle: measured time with no events (the recorded run: 60s)")
	dur(&c.idleSettle, "idle-settle", 12*time.Second, "idle: time without events before the measure starts (the relay's --quiet-after, 10s, and 2s): an idle relay is measured as it runs for hours, not in the seconds after its last event")
	num(&c.memN, "memory-n", 20_000, "memory: backlog of large documents drained by an outboxd relay (the recorded run: 1000000)")
	num(&c.memDocKB, "memory-doc-kb", 10, "memory: document size in the backlog and the sustained phase, KB")
	num(&c.memRate, "memory-rate", 2000, "memory: events/s of the sustained phase")
	dur(&c.memDuration, "memory-duration", 15*time.Second, "memory: length of the sustained phase")
	num(&c.memBigMB, "memory-big-mb", 50, "memory: size of the single large document, MB (0 skips it)")
	num(&c.shutdownN, "shutdown-n", 200_000, "shutdown: backlog the relay is draining when it gets SIGTERM")
	num(&c.backfillN, "backfill-n", 1_000_000, "backfill: rows of ~1 KB in the table (the goal's size)")
	num(&c.backfillBatch, "backfill-batch", 0, "backfill: outboxd backfill --batch (0: its default)")
	num(&c.backfillInFlight, "backfill-in-flight", 0, "backfill: outboxd backfill --in-flight (0: its default)")
	num(&c.backfillRepeat, "backfill-repeat", 1, "backfill: rounds of the three loads; the best of each is kept")
	num(&c.backfillMemKBN, "backfillmem-kb-n", 100_000, "backfillmem: rows of 1 KB")
	num(&c.backfillMemMBN, "backfillmem-mb-n", 200, "backfillmem: rows of 1 MB")
	num(&c.backfillMemPeakMB, "backfillmem-peak-mb", 150, "backfillmem: the peak RSS, in MB, outboxd backfill must stay under at either row size")
	num(&c.documentsN, "documents-n", 100_000, "documents: parents of the definition-fed index (the recorded run: 1000000)")
	num(&c.documentsChildren, "documents-children", 5, "documents: children per parent, aggregated into its document")
	num(&c.documentsFanout, "documents-fanout", 10_000, "documents: parents sharing the lookup row that changes (the recorded run: 100000)")
	num(&c.documentsBatch, "documents-batch", 4000, "documents: ids per definition read of the hand-written loader (outboxd backfill's --batch default)")
	str(&c.profileDir, "profile-dir", "", "write a CPU profile of each relay child here (go tool pprof)")
	str(&c.childGOGC, "child-gogc", "", "GOGC for relay child processes (experiment; default: Go's 100)")
	fs.BoolVar(&c.keep, "keep", envBool("keep"), "keep schemas and indices (for inspection)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	for name, v := range map[string]int{"drain-n": c.drainN, "naive-n": c.naiveN, "wal-n": c.walN, "wal-repeat": c.walRepeat,
		"lat-rate": c.latRate, "lat-workers": c.latWorkers, "e2e-n": c.e2eN, "e2e-naive-n": c.e2eNaiveN, "e2e-page-docs": c.e2ePageDocs, "e2e-rounds": c.e2eRounds,
		"bulk-docs": c.bulkDocs, "bulk-workers": c.bulkWorkers, "page-docs": c.pageDocs, "prefetch": c.prefetch,
		"load-tx": c.loadTx, "load-workers": c.loadWorkers, "writers-conns": c.writersConns, "pgbench-scale": c.pgbenchScale, "pgbench-clients": c.pgbenchClients,
		"pgbench-threads": c.pgbenchThreads, "pgbench-rounds": c.pgbenchRounds, "lowrate-workers": c.lowWorkers, "lowrate-high-workers": c.highWorkers,
		"memory-n": c.memN, "memory-doc-kb": c.memDocKB, "memory-rate": c.memRate, "shutdown-n": c.shutdownN,
		"backfill-n": c.backfillN, "backfill-repeat": c.backfillRepeat,
		"backfillmem-kb-n": c.backfillMemKBN, "backfillmem-mb-n": c.backfillMemMBN, "backfillmem-peak-mb": c.backfillMemPeakMB,
		"documents-n": c.documentsN, "documents-children": c.documentsChildren, "documents-fanout": c.documentsFanout, "documents-batch": c.documentsBatch} {
		if v < 1 {
			return nil, fmt.Errorf("%s: must be >= 1, got %d", name, v)
		}
	}
	if c.documentsFanout > c.documentsN {
		return nil, fmt.Errorf("documents-fanout: must be <= documents-n (%d), got %d", c.documentsN, c.documentsFanout)
	}
	if c.writersRounds < 2 {
		return nil, fmt.Errorf("writers-rounds: must be >= 2, got %d", c.writersRounds)
	}
	if c.pgbenchPhase < time.Second {
		return nil, fmt.Errorf("pgbench-phase: must be >= 1s, got %s", c.pgbenchPhase)
	}
	if c.memBigMB < 0 {
		return nil, fmt.Errorf("memory-big-mb: must be >= 0, got %d", c.memBigMB)
	}
	for name, v := range map[string]int{"peer-n": c.peerN, "backfill-batch": c.backfillBatch, "backfill-in-flight": c.backfillInFlight} {
		if v < 0 {
			return nil, fmt.Errorf("%s: must be >= 0, got %d", name, v)
		}
	}
	if _, err := c.rss(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *config) rss() ([]int, error) {
	var out []int
	for _, f := range strings.Split(c.rssSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("rss-sizes: %q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func (c *config) selected() (map[string]bool, error) {
	all := scenarioNames
	out := map[string]bool{}
	for _, s := range strings.Split(c.scenarios, ",") {
		s = strings.TrimSpace(s)
		switch {
		case s == "all":
			for _, a := range all {
				out[a] = true
			}
		case slices.Contains(all, s):
			out[s] = true
		default:
			return nil, fmt.Errorf("scenarios: unknown scenario %q (want %s or all)", s, strings.Join(all, ","))
		}
	}
	return out, nil
}

func run(ctx context.Context, args []string) error {
	cfg, err := parseConfig(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	sel, err := cfg.selected()
	if err != nil {
		return err
	}
	b, err := newBench(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.cleanup()

	b.rep.header(fmt.Sprintf("outboxd benchmark  %s  %s/%s  %d CPUs  %s", time.Now().Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), b.serverInfo(ctx)))
	if cfg.relayArgs != "" {
		b.rep.line("outboxd relay children run with: %s", strings.TrimSpace(relayArgsShown(cfg.relayArgs)))
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"drain", b.drainScenario},
		{"wal", b.walScenario},
		{"latency", b.latencyScenario},
		{"rss", b.rssScenario},
		{"e2e", b.e2eScenario},
		{"writers", b.writersScenario},
		{"pgbench", b.pgbenchScenario},
		{"lowrate", b.lowrateScenario},
		{"idle", b.idleScenario},
		{"memory", b.memoryScenario},
		{"shutdown", b.shutdownScenario},
		{"backfill", b.backfillScenario},
		{"backfillmem", b.backfillMemoryScenario},
		{"documents", b.documentsScenario},
	}
	var failed []string
	for _, s := range steps {
		if !sel[s.name] {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		b.rep.section(s.name)
		if err := s.fn(ctx); err != nil {
			b.rep.line("ERROR: %v", err)
			failed = append(failed, s.name)
		}
		b.rep.line("(%s took %s)", s.name, time.Since(start).Round(time.Second))
		b.cleanupSchemas()
	}
	b.rep.summary()
	if len(failed) > 0 {
		return fmt.Errorf("scenarios failed: %s", strings.Join(failed, ", "))
	}
	return ctx.Err()
}

func envKey(name string) string {
	return "BENCH_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

func envString(name, def string) string {
	if v, ok := os.LookupEnv(envKey(name)); ok && v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v := envString(name, ""); v != "" {
		if n, err := strconv.Atoi(strings.ReplaceAll(v, "_", "")); err == nil {
			return n
		}
		fmt.Fprintf(os.Stderr, "benchharness: %s=%q is not a number; using %d\n", envKey(name), v, def)
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := envString(name, ""); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		fmt.Fprintf(os.Stderr, "benchharness: %s=%q is not a duration; using %s\n", envKey(name), v, def)
	}
	return def
}

func envBool(name string) bool {
	v, _ := strconv.ParseBool(envString(name, "false"))
	return v
}
