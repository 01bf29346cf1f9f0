package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
)

// deliveries resolve --retry of a message whose destination no relay
// serves leaves it waiting, its reserved age starting afresh, not reserved
// forever; it is sent once a relay serves the destination again.
func TestResolveRetryForAnUnservedDestinationWaits(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	ctx := context.Background()
	var refuse atomic.Bool
	refuse.Store(true)
	var requests atomic.Int32
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		requests.Add(1)
		if refuse.Load() {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	defer rcv.Close()

	first := startFleetRelay(t, e, hookSpec("billing", rcv.URL))
	e.message(t, "billing", "k")
	schematest.Eventually(t, 20*time.Second, "the receiver's 400 fails the message", func() bool { return e.ledgerStates(t, "billing")["failed"] == 1 })
	first.stop()
	// No relay serves billing from here on.
	startFleetRelay(t, e)
	var before time.Time
	if err := e.pool.QueryRow(ctx, `SELECT reserved_at FROM "`+e.schema+`".deliveries WHERE destination = 'billing'`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := deliveries(ctx, append(append([]string{"resolve"}, e.dbArgs...), "k", "--destination", "billing", "--retry", "--operator", "alice"), &out); err != nil {
		t.Fatal(err)
	}
	// The unrouted stream has read the new message once the relay's
	// backlog of the message namespace is empty.
	schematest.Eventually(t, 20*time.Second, "the relay has read the retried message", func() bool {
		var n int64
		err := e.pool.QueryRow(ctx, `SELECT b.n FROM "`+e.schema+`".progress p, LATERAL (SELECT count(*) AS n FROM "`+e.schema+`".events e
			WHERE NOT pg_visible_in_snapshot(e.xid, p.done_snapshot) AND e.index_name LIKE '.outboxd-message.%') b
			WHERE p.stream = 'webhook-unrouted'`).Scan(&n)
		return err == nil && n == 0
	})
	var state string
	var reservedAt time.Time
	if err := e.pool.QueryRow(ctx, `SELECT state, reserved_at FROM "`+e.schema+`".deliveries WHERE destination = 'billing'`).Scan(&state, &reservedAt); err != nil {
		t.Fatal(err)
	}
	if state != "waiting" || !reservedAt.After(before) {
		t.Fatalf("after resolve --retry with no relay serving billing: state %q (want waiting), reserved_at %s (was %s, want reset)", state, reservedAt, before)
	}
	refuse.Store(false)
	startFleetRelay(t, e, hookSpec("billing", rcv.URL))
	schematest.Eventually(t, 20*time.Second, "the retried message is delivered once a relay serves billing", func() bool {
		return e.ledgerStates(t, "billing")["delivered"] == 1
	})
	if n := requests.Load(); n != 2 {
		t.Fatalf("%d requests, want 2 (the refused one and the retry)", n)
	}
}
