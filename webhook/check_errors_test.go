package webhook_test

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// TestCheckAdminShutdown: the check's PostgreSQL session is terminated
// while the check runs (pg_terminate_backend: SQLSTATE 57P01, as in a
// server restart or a failover). That says nothing about the message: the
// check runs again on another session and the message is delivered once.
func TestCheckAdminShutdown(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := setup(t)
	rcv := newScripted(t, status(200))
	// A lock key of this test's own: advisory locks are database-wide.
	key := 1_000_000 + rand.IntN(1<<30)
	d := destination("hook", rcv.URL, false)
	d.CheckTimeout = 30 * time.Second
	d.Check = fmt.Sprintf(`SELECT true FROM (SELECT pg_advisory_xact_lock_shared(%d)) l WHERE $1::text <> '' AND $2::jsonb IS NOT NULL`, key)
	var logs lockedBuffer
	s := e.sink(t, e.pool, d, webhook.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})

	lock, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		t.Fatal(err)
	}
	ev := message(e.send(t, "hook", "k", `{}`), "hook", "k", `{}`)
	done := make(chan outbox.Outcome, 1)
	go func() { done <- write(t, s, ev) }()
	var pid int
	schematest.Eventually(t, 20*time.Second, "the check waits for the lock", func() bool {
		return e.pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND NOT granted`, key).Scan(&pid) == nil
	})
	var killed bool
	if err := e.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, killed, err)
	}
	// Released only now: the check run again may wait for it, never pass
	// before its first session was terminated.
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
		t.Fatal(err)
	}
	out := <-done
	if got := e.delivery(t, "hook", "k"); got.State != webhook.StateDelivered || rcv.count() != 1 {
		t.Fatalf("state %s (%s), outcome %s %q, %d requests; want delivered once", got.State, got.LastError, out.Status, out.Reason, rcv.count())
	}
	again := records(t, logs.String(), "running it again")
	if len(again) != 1 || again[0]["sqlstate"] != "57P01" {
		t.Fatalf("log records of the check run again: %v; want one with sqlstate 57P01", again)
	}
}

// TestCheckStatementTimeout: a check that runs past check_timeout is
// cancelled by PostgreSQL (SQLSTATE 57014), so the message is not sent
// when the check would have passed. A timeout is a transient error: the
// check runs again after a backoff, up to max_attempts runs in all (the
// message's attempts are not charged); a timeout every time then fails
// the message, naming the SQLSTATE, with no request sent.
func TestCheckStatementTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rcv := newScripted(t, status(200))
	d := destination("hook", rcv.URL, false)
	d.MaxAttempts, d.CheckTimeout = 3, 200*time.Millisecond
	d.Check = `SELECT pg_sleep(2) IS NOT NULL AND $1 <> '' AND $2::jsonb IS NOT NULL`
	var logs lockedBuffer
	s := e.sink(t, e.pool, d, webhook.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	out := write(t, s, message(e.send(t, "hook", "k", `{}`), "hook", "k", `{}`))
	got := e.delivery(t, "hook", "k")
	if got.State != webhook.StateFailed || rcv.count() != 0 || got.Attempts != 0 {
		t.Fatalf("state %s after %d attempts (%s), outcome %s, %d requests; want failed by the check, none sent", got.State, got.Attempts, got.LastError, out.Status, rcv.count())
	}
	if !strings.Contains(got.LastError, "statement timeout") || !strings.Contains(got.LastError, "SQLSTATE 57014") {
		t.Errorf("last error %q: want the statement timeout and its SQLSTATE", got.LastError)
	}
	again := records(t, logs.String(), "running it again")
	if len(again) != d.MaxAttempts-1 {
		t.Fatalf("the check was run again %d times, want %d (max_attempts runs in all)", len(again), d.MaxAttempts-1)
	}
	for _, r := range again {
		if r["sqlstate"] != "57014" {
			t.Errorf("a check run again after %v, want sqlstate 57014", r["sqlstate"])
		}
	}
}
