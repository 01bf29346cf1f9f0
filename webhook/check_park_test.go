package webhook_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// TestCheckErrorParked: a check that times out (SQLSTATE 57014, a
// transient error) on every run for one message runs again under the
// retry rule: in line only within retry_inline of the first run, then
// parked as retrying with its backoff, and run again by the destination's
// leader when due. So the 50 messages behind it are delivered within
// retry_inline and one attempt, not after the max_attempts runs and their
// backoffs; the message itself ends failed with the check's error after
// max_attempts runs in all, with no request sent and no attempt charged.
func TestCheckErrorParked(t *testing.T) {
	t.Parallel()
	const others = 50
	ctx := context.Background()
	e := setup(t)
	var lastAt time.Time // when the last of the others was applied
	rcv := newKeyed(t, false, func(string, int) reply { return reply{} })
	rcv.onEffect = func(key string) {
		if len(rcv.effects)-rcv.effects["slow"] == others {
			lastAt = time.Now()
		}
	}
	d := destination("hook", rcv.URL, false)
	// In line, the runs of the slow message's check take 6 × 200 ms and
	// their backoffs at least 0.5 + 4 × 1 s: far past retry_inline.
	d.RetryInline, d.CheckTimeout = time.Second, 200*time.Millisecond
	d.BackoffBase, d.BackoffMax, d.MaxAttempts = time.Second, 2*time.Second, 6
	d.Check = `SELECT CASE WHEN ($2::jsonb->>'slow') IS NOT NULL THEN pg_sleep(2) IS NOT NULL ELSE $1 <> '' END`
	var logs lockedBuffer
	s, err := webhook.NewSink(webhook.Options{Pool: e.pool, Schema: e.schema, Destination: d,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	unrouted, err := webhook.NewUnroutedSink(e.pool, e.schema, []string{d.Name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Pages of 10: the slow message's page, the others the relay has at
	// the sink with it, and more behind them that wait for its page.
	cfg := relayConfig(e.pool, e.schema, []relay.Stream{
		{Name: "webhook-hook", BucketHi: 1023, Indexes: []string{outbox.MessageIndex(d.Name)}, Sink: s},
		{Name: "webhook-unrouted", BucketHi: 1023, Indexes: []string{outbox.MessagePrefix + "*"}, Sink: unrouted},
	})
	cfg.MaxBatchDocs = 10
	start(t, cfg)

	began := time.Now()
	if _, err := e.pool.Exec(ctx, `SELECT "`+e.schema+`".append_message('hook',
			CASE WHEN g = 0 THEN 'slow' ELSE 'm' || g END,
			CASE WHEN g = 0 THEN '{"slow": true}'::jsonb ELSE jsonb_build_object('n', g) END)
		FROM generate_series(0, $1::int) g`, others); err != nil {
		t.Fatal(err)
	}
	schematest.Eventually(t, 30*time.Second, fmt.Sprintf("the %d messages after the slow one are delivered", others), func() bool {
		n := 0
		for k, dl := range e.all(t) {
			if k != "slow" && dl.State == webhook.StateDelivered {
				n++
			}
		}
		return n == others
	})
	rcv.mu.Lock()
	took := lastAt.Sub(began)
	rcv.mu.Unlock()
	slow := e.delivery(t, "hook", "slow")
	t.Logf("the %d others were delivered %s after the append; the slow message was %s then", others, took.Round(time.Millisecond), slow.State)
	// The order, not a wall-clock bound, is the proof: held back by the
	// slow message's in-line check runs, the others would arrive only after
	// it had failed (it did, on the code before the parking); parked, it is
	// still retrying when the last of them arrives.
	if slow.State != webhook.StateRetrying || slow.NextAttemptAt == nil || slow.Attempts != 0 || !strings.Contains(slow.LastError, "SQLSTATE 57014") {
		t.Fatalf("slow: state %s, next attempt %v, %d attempts, last error %q; want retrying, a next attempt, none charged, the check's error",
			slow.State, slow.NextAttemptAt, slow.Attempts, slow.LastError)
	}

	slow = e.waitState(t, "hook", "slow", webhook.StateFailed)
	if requests, _ := rcv.counts("slow"); requests != 0 || slow.Attempts != 0 {
		t.Errorf("slow: %d requests, %d attempts; want none: the check never passed", requests, slow.Attempts)
	}
	if !strings.Contains(slow.LastError, "statement timeout") || !strings.Contains(slow.LastError, "SQLSTATE 57014") {
		t.Errorf("slow: last error %q, want the statement timeout and its SQLSTATE", slow.LastError)
	}
	again := records(t, logs.String(), "running it again")
	if len(again) != d.MaxAttempts-1 {
		t.Errorf("the check was run again %d times, want %d (max_attempts runs in all)", len(again), d.MaxAttempts-1)
	}
	for k, dl := range e.all(t) {
		if _, effects := rcv.counts(k); k != "slow" && (effects != 1 || dl.State != webhook.StateDelivered) {
			t.Errorf("%s: %d effects, state %s", k, effects, dl.State)
		}
	}
}
