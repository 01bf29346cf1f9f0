package webhook_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// TestCheckRunsSurviveRestart: the runs of a check that erred travel with
// the parked row, in a column of the ledger, not in its last_error text.
// A message whose check times out every time is parked after its first
// run by one sink (all a relay holds of a destination), which then stops;
// its last_error is rewritten (an operator's note, or the wording of
// another version); a new sink leads the destination. The limit still
// holds: the new sink runs the check max_attempts-1 more times, not
// max_attempts, and the message fails with the check's error.
func TestCheckRunsSurviveRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rcv := newScripted(t, status(200))
	d := destination("hook", rcv.URL, false)
	// The first run's 200 ms are past retry_inline: each erred run parks.
	d.MaxAttempts, d.CheckTimeout, d.RetryInline = 4, 200*time.Millisecond, time.Millisecond
	d.Check = `SELECT pg_sleep(2) IS NOT NULL AND $1 <> '' AND $2::jsonb IS NOT NULL`

	first := e.sink(t, e.pool, d, webhook.Options{Logger: slog.New(slog.DiscardHandler)})
	write(t, first, message(e.send(t, "hook", "k", `{}`), "hook", "k", `{}`))
	parked := e.delivery(t, "hook", "k")
	if parked.State != webhook.StateRetrying || parked.Attempts != 0 || !strings.Contains(parked.LastError, "check run 1 of 4") {
		t.Fatalf("after the first run: state %s, %d attempts, last error %q; want retrying, none charged, check run 1 of 4",
			parked.State, parked.Attempts, parked.LastError)
	}
	if parked.CheckRuns != 1 {
		t.Fatalf("after the first run: check_runs %d, want 1", parked.CheckRuns)
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE "`+e.schema+`".deliveries SET last_error = 'looked at by ops: the check db is slow'
		WHERE destination = 'hook' AND dedupe_key = 'k'`); err != nil {
		t.Fatal(err)
	}

	var logs lockedBuffer
	second := e.sink(t, e.pool, d, webhook.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	led := make(chan struct{})
	go func() { defer close(led); second.Lead(ctx) }()
	failed := e.waitState(t, "hook", "k", webhook.StateFailed)
	cancel()
	<-led
	if rcv.count() != 0 || failed.Attempts != 0 || failed.CheckRuns != d.MaxAttempts || !strings.Contains(failed.LastError, "SQLSTATE 57014") {
		t.Errorf("failed: %d requests, %d attempts, %d check runs, last error %q; want none sent, %d erred runs, the check's timeout",
			rcv.count(), failed.Attempts, failed.CheckRuns, failed.LastError, d.MaxAttempts)
	}
	// Runs 2 and 3 err and park again; run 4, the last, fails the message.
	if again := records(t, logs.String(), "running it again"); len(again) != d.MaxAttempts-2 {
		t.Errorf("the new sink ran the check again %d times, want %d: the first sink's run counts", len(again), d.MaxAttempts-2)
	}
	// Sent again by an operator, the message starts with no erred run.
	again, err := webhook.Resolve(context.Background(), e.pool, e.schema, "hook", "k", webhook.ResolveRetry, "op")
	if err != nil || again.State != webhook.StateWaiting || again.CheckRuns != 0 {
		t.Errorf("resolve --retry: state %s, check_runs %d, err %v; want waiting, 0", again.State, again.CheckRuns, err)
	}
}

// TestCheckRunsReset: the erred runs count only while they are unbroken.
// A message parked by its check's timeout whose check then passes, and
// whose request is answered 429, is parked again with check_runs 0 and
// one attempt charged: its next check errors start counting afresh.
func TestCheckRunsReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE "`+e.schema+`".check_slow (on_ boolean)`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".check_slow VALUES (true)`); err != nil {
		t.Fatal(err)
	}
	// A minute's Retry-After: the second park is the last thing that runs.
	rcv := newScripted(t, status(429, "Retry-After", "60"))
	d := destination("hook", rcv.URL, false)
	d.MaxAttempts, d.CheckTimeout, d.RetryInline = 4, 200*time.Millisecond, time.Millisecond
	d.Check = `SELECT CASE WHEN EXISTS (SELECT 1 FROM "` + e.schema + `".check_slow) THEN pg_sleep(2) IS NOT NULL
		ELSE $1 <> '' AND $2::jsonb IS NOT NULL END`
	s := e.sink(t, e.pool, d, webhook.Options{Logger: slog.New(slog.DiscardHandler)})
	write(t, s, message(e.send(t, "hook", "k", `{}`), "hook", "k", `{}`))
	if got := e.delivery(t, "hook", "k"); got.State != webhook.StateRetrying || got.CheckRuns != 1 {
		t.Fatalf("after the first run: state %s, check_runs %d; want retrying, 1", got.State, got.CheckRuns)
	}
	if _, err := e.pool.Exec(ctx, `DELETE FROM "`+e.schema+`".check_slow`); err != nil {
		t.Fatal(err)
	}

	lctx, cancel := context.WithCancel(ctx)
	led := make(chan struct{})
	go func() { defer close(led); s.Lead(lctx) }()
	var got webhook.Delivery
	schematest.Eventually(t, 20*time.Second, "the 429 is recorded", func() bool {
		got = e.delivery(t, "hook", "k")
		return got.LastStatus != nil && *got.LastStatus == 429
	})
	cancel()
	<-led
	if got.State != webhook.StateRetrying || got.Attempts != 1 || got.CheckRuns != 0 || rcv.count() != 1 {
		t.Errorf("after the 429: state %s, %d attempts, check_runs %d, %d requests; want retrying, 1, 0, 1",
			got.State, got.Attempts, got.CheckRuns, rcv.count())
	}
}
