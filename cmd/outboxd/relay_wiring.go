package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/rebuild"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/webhook"
)

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
	hooks, err := messageStreams(pool, schemaName, f.destinations, 10*f.maxPoll, min(f.batchBytes, unroutedPageBytes), reg, log)
	if err != nil {
		return nil, err
	}
	return relay.New(relay.Config{
		Pool: pool, Schema: schemaName, Sink: docs, Streams: append(streams, hooks...),
		MaxBatchDocs: f.batchDocs, MaxBatchBytes: f.batchBytes, Prefetch: f.prefetch, InFlight: f.inFlight,
		MinPollInterval: f.minPoll, MaxPollInterval: f.maxPoll, QuietAfter: f.quietAfter, QuietPollInterval: f.quietPoll, Linger: lingerOf(f.linger), LingerDocs: f.lingerDocs,
		MaxAttempts: f.maxAttempts, BackoffBase: f.backoffBase, BackoffMax: f.backoffMax,
		LeaseInterval: f.lease, ShutdownTimeout: f.shutdown, Wakeup: f.wakeup, StoreInterval: f.storeInterval,
		Registerer: reg, Logger: log,
	})
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

// messageStreams gives each --destination a stream and sink of its own (a
// slow receiver holds back only its own messages) and, on every relay, the
// unrouted stream that records as waiting the messages of destinations no
// live relay serves: every committed message gets a ledger row, whatever
// the relays' flags. The ledger's gauges go on /metrics. The unrouted
// stream polls every unroutedPoll when idle (the relay passes 10 times
// --max-poll, a second by default): every relay has it, so at --max-poll
// it doubled an idle relay's queries and CPU, and what it reads is only
// recorded as waiting until a relay that serves the destination starts.
// For the same reason it reads pages of at most unroutedBytes: each page
// it holds ahead or at its sink counts toward --memory-limit auto.
func messageStreams(pool *pgxpool.Pool, schemaName string, specs []string, unroutedPoll time.Duration, unroutedBytes int, reg *prometheus.Registry, log *slog.Logger) ([]relay.Stream, error) {
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
		out = append(out, relay.Stream{Name: messageStream(d.Name), BucketHi: 1023, Indexes: []string{outbox.MessageIndex(d.Name)}, Sink: sink, NoLinger: true})
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
	return append(out, relay.Stream{Name: "webhook-unrouted", BucketHi: 1023, Indexes: []string{outbox.MessagePrefix + "*"}, Sink: unrouted,
		MaxPollInterval: unroutedPoll, MaxBatchBytes: unroutedBytes}), nil
}

// unroutedPageBytes bounds the unrouted stream's pages. Its sink inserts a
// ledger row per message, so larger pages buy it nothing, while every relay
// runs it: at --batch-bytes (4 MiB) it added 36 MiB to the memory limit.
const unroutedPageBytes = 1 << 20

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
