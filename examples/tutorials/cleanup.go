package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
)

// DefaultCleanupSchedule runs the expired-key job every ten minutes.
const DefaultCleanupSchedule = "@every 10m"

// cronLogger adapts slog to cron's logger interface.
type cronLogger struct{ log *slog.Logger }

func (l cronLogger) Info(msg string, kv ...any) { l.log.Debug("cron: "+msg, kv...) }
func (l cronLogger) Error(err error, msg string, kv ...any) {
	l.log.Error("cron: "+msg, append(kv, "err", err)...)
}

// StartCleanup runs DeleteExpiredKeys on schedule (cron syntax or
// "@every 10m") until ctx ends. A run that is still going when the next is
// due is skipped, and a panic in one run is logged, not fatal. The returned
// function stops the scheduler and waits for a running job.
func (s *Server) StartCleanup(ctx context.Context, schedule string) (stop func(), err error) {
	l := cronLogger{s.log}
	c := cron.New(cron.WithLogger(l), cron.WithChain(cron.Recover(l), cron.SkipIfStillRunning(l)))
	_, err = c.AddFunc(schedule, func() {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		n, err := s.keys.DeleteExpiredKeys(ctx)
		s.metrics.expiredDeleted.Add(float64(n))
		if err != nil {
			s.log.Error("delete expired idempotency keys", "deleted", n, "err", err)
			return
		}
		s.log.Info("deleted expired idempotency keys", "deleted", n)
	})
	if err != nil {
		return nil, fmt.Errorf("tutorials: key cleanup schedule %q: %w", schedule, err)
	}
	c.Start()
	done := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
		}
		<-c.Stop().Done()
	}()
	return func() {
		once.Do(func() { close(done) })
		<-c.Stop().Done()
	}, nil
}
