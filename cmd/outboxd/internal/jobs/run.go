package jobs

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"
)

// run performs one run of j if this replica can take the job's lock.
//
// The lock is a session advisory lock held on a connection taken out of
// the pool for the run: if this process dies, PostgreSQL drops the lock
// with the session and another replica can run the job at its next tick.
func (s *Scheduler) run(ctx context.Context, j *job) error {
	if s.ident == "" {
		return fmt.Errorf("jobs: run %q: schema %q is not a valid identifier", j.name, s.cfg.Schema)
	}
	if s.cfg.Pool == nil {
		return fmt.Errorf("jobs: run %q: config: Pool is required", j.name)
	}
	j.tick("", true)
	if s.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, s.cfg.Timeout, fmt.Errorf("%w after %v", ErrTimedOut, s.cfg.Timeout))
		defer cancel()
	}
	conn, err := s.cfg.Pool.Acquire(ctx)
	if err != nil {
		j.tick("failed", false)
		s.log.Error("jobs: cannot get a connection for the job's lock", "job", j.name, "err", err)
		return fmt.Errorf("jobs: run %q: %w", j.name, err)
	}
	k2 := hash31(j.name)
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, s.k1, k2).Scan(&locked); err != nil {
		conn.Release()
		j.tick("failed", false)
		s.log.Error("jobs: cannot take the job's lock", "job", j.name, "err", err)
		return fmt.Errorf("jobs: run %q: lock: %w", j.name, err)
	}
	if !locked {
		conn.Release()
		j.tick(ErrSkipped.Error(), false)
		s.metrics.skips.WithLabelValues(j.name).Inc()
		s.log.Debug("jobs: skipped, another replica runs it", "job", j.name)
		return fmt.Errorf("jobs: run %q: %w", j.name, ErrSkipped)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1, $2)`, s.k1, k2); err != nil {
			// A pooled session must never keep the lock: close it, and
			// PostgreSQL releases the lock with it.
			s.log.Warn("jobs: unlock failed; closing the connection", "job", j.name, "err", err)
			_ = conn.Hijack().Close(uctx)
			return
		}
		conn.Release()
	}()

	// Bookkeeping outlives ctx so that a run cut short by Stop is still
	// recorded.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if _, err := conn.Exec(bctx, `INSERT INTO `+s.ident+`.job_runs AS r (job, last_start) VALUES ($1, now())
		ON CONFLICT (job) DO UPDATE SET last_start = now()`, j.name); err != nil {
		s.log.Warn("jobs: cannot record the job's start", "job", j.name, "err", err)
	}
	cancel()

	s.log.Info("jobs: run started", "job", j.name)
	start := time.Now()
	runErr := call(ctx, j.fn)
	d := time.Since(start)
	if cause := context.Cause(ctx); runErr != nil && errors.Is(cause, ErrTimedOut) {
		// The job's own error is often just "context deadline exceeded".
		runErr = fmt.Errorf("%w: %w", cause, runErr)
	}

	s.metrics.runs.WithLabelValues(j.name).Inc()
	s.metrics.duration.WithLabelValues(j.name).Observe(d.Seconds())
	var lastErr any
	failed := 0
	if runErr != nil {
		failed = 1
		lastErr = runErr.Error()
		s.metrics.failures.WithLabelValues(j.name).Inc()
		s.log.Error("jobs: run failed", "job", j.name, "duration", d, "err", runErr)
		j.tick("failed", false)
	} else {
		s.log.Info("jobs: run finished", "job", j.name, "duration", d)
		j.tick("ok", false)
	}
	bctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(bctx, `INSERT INTO `+s.ident+`.job_runs AS r (job, last_start, last_end, last_error, runs, failures)
		VALUES ($1, $2, now(), $3, 1, $4)
		ON CONFLICT (job) DO UPDATE SET last_end = now(), last_error = $3, runs = r.runs + 1, failures = r.failures + $4`,
		j.name, start, lastErr, failed); err != nil {
		s.log.Warn("jobs: cannot record the job's end", "job", j.name, "err", err)
	}
	if runErr != nil {
		return fmt.Errorf("jobs: run %q: %w", j.name, runErr)
	}
	return nil
}

// hash31 is a stable, positive 31-bit hash for advisory lock keys. The
// first key is namespaced "outboxd-jobs:" so it never meets the relay's
// leadership keys ("outboxd:<schema>").
func hash31(s string) int32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return int32(h.Sum32() & 0x7fffffff)
}
