package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// jobPoolConns is what the scheduled jobs can hold at once if they all run
// together: each job's lock connection plus the connections its work
// uses at the same time (reconcile: the source query and a fix
// transaction; retention and dead-letter retry: one; tombstone purge:
// none, it talks to Elasticsearch), and one for the page's job_runs read.
const jobPoolConns = (1 + 2) + (1 + 1) + (1 + 1) + 1 + 1

// newJobPool returns a pool for the scheduled jobs alone, with the relay's
// connection settings. Sharing the relay's pool let jobs that each hold a
// lock connection and wait for a work connection take every connection,
// and the stream readers waited behind them; sized for all jobs at once,
// this pool also never makes jobs wait for each other.
func newJobPool(ctx context.Context, relayPool *pgxpool.Pool) (*pgxpool.Pool, error) {
	cfg := relayPool.Config()
	cfg.MaxConns = jobPoolConns
	cfg.MinConns = 0
	cfg.ConnConfig.RuntimeParams["application_name"] = "outboxd-jobs"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL for scheduled jobs: %w", err)
	}
	return pool, nil
}
