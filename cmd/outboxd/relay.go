package main

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/webhook"
)

func init() {
	register("relay", "stream committed outbox events to Elasticsearch and messages to webhooks (with admin page and scheduled maintenance)", runRelay)
}

func runRelay(ctx context.Context, args []string) error {
	db, es, f, err := parseRelayFlags(args)
	if err != nil {
		return err
	}
	log := slog.Default()

	// The checks of outboxd check: what needs no server is refused before
	// the relay waits for one.
	p := &preflight{db: db, es: es, f: f}
	if err := refuseAtStart(log, p.beforeConnecting(ctx)...); err != nil {
		return err
	}
	pool, err := relayPool(ctx, db, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for PostgreSQL
		}
		return err
	}
	defer pool.Close()
	if err := refuseAtStart(log, append([]finding{p.schemaVersion(ctx, pool)}, p.destinations(ctx, pool)...)...); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	esCfg, client, server := p.search(ctx)
	reached := client
	if server.problem() {
		reached = nil // the spec waits for a server that answers: the sink checks it then
	}
	if err := refuseAtStart(log, server, p.indexSpec(ctx, reached, len(esCfg.Addresses))); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	spec := p.spec
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r, err := newRelay(ctx, pool, db.schema, client, spec, f, reg, log)
	if err != nil {
		return err
	}
	var pageBytes []int
	for _, s := range r.Streams() {
		pageBytes = append(pageBytes, cmp.Or(s.MaxBatchBytes, f.batchBytes))
	}
	limit, err := relayMemoryLimit(f.memoryLimit, f, pageBytes)
	if err != nil {
		return err
	}
	applyMemoryLimit(limit, log)
	if governScheduler {
		go governProcs(ctx, log)
	}

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
