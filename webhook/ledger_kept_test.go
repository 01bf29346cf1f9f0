package webhook_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// A delivered message whose event the outbox still keeps (another stream
// lags) keeps its ledger row past the ledger's retention, so the
// destination's stream, registered anew after `streams drop`, does not
// send it a second time.
func TestLedgerRowKeptWhileItsEventIsRetained(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	rec := newScripted(t, status(http.StatusOK))
	d := destination("d", rec.URL, false)
	e.send(t, "d", "k1", `{"n":1}`)
	stop := e.run(t, d)
	e.waitState(t, "d", "k1", webhook.StateDelivered)
	stop()
	// A lagging stream (an abandoned search stream) keeps the event.
	if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".progress (stream, done_snapshot) VALUES ('search-lagging', '1:1:')`); err != nil {
		t.Fatal(err)
	}
	// 40 days pass: --retention 7d, --ledger-retention 30d (the defaults).
	e.pool.Exec(ctx, `UPDATE "`+e.schema+`".deliveries SET finished_at = finished_at - interval '40 days'`)
	e.pool.Exec(ctx, `UPDATE "`+e.schema+`".events SET created_at = created_at - interval '40 days'`)
	n, err := relay.DeleteAcknowledged(ctx, e.pool, e.schema, 7*24*time.Hour, 100)
	t.Logf("events deleted %d %v", n, err)
	m, err := webhook.PurgeLedger(ctx, e.pool, e.schema, 30*24*time.Hour, 100)
	t.Logf("ledger rows deleted %d %v", m, err)
	if err != nil || m != 0 {
		t.Fatalf("ledger retention deleted %d rows (%v) while the outbox still holds their message", m, err)
	}
	// The stopped relay's sessions end on the server a moment after it
	// returns; until then the drop is refused for a live relay.
	var dropErr error
	schematest.Eventually(t, 30*time.Second, "the stream is dropped once no relay holds it", func() bool {
		dropErr = relay.DropStream(ctx, e.pool, e.schema, "webhook-d", "alice")
		return dropErr == nil
	})
	e.run(t, d)
	time.Sleep(2 * time.Second)
	if c := rec.count(); c != 1 {
		t.Fatalf("receiver got %d requests for one message", c)
	}
}
