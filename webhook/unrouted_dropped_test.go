package webhook_test

import (
	"context"
	"hash/fnv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// Relay A serves d (advertised, webhook-d registered) but has not read M
// yet; the unrouted stream passes M through without a ledger row. A is
// stopped for good (d removed), webhook-d is dropped: retention deletes M.
func TestMessageOfADroppedStreamKeepsItsLedgerRow(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, schematest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	conn.Exec(ctx, `INSERT INTO "`+e.schema+`".relays (pid, streams) VALUES (pg_backend_pid(), '{webhook-d}')`)
	conn.Exec(ctx, `INSERT INTO "`+e.schema+`".progress (stream, done_snapshot) VALUES ('webhook-d', '1:1:')`)
	h := fnv.New64a()
	h.Write([]byte("outboxd.members\x00" + e.schema))
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared($1)`, int64(h.Sum64())); err != nil {
		t.Fatal(err)
	}
	e.send(t, "d", "m1", `{}`)
	u, err := webhook.NewUnroutedSink(e.pool, e.schema, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	u.SetServed(func(ctx context.Context, dests []string) (map[string]bool, error) {
		led, err := relay.Served(ctx, e.pool, e.schema, []string{"webhook-d"})
		return map[string]bool{"d": led["webhook-d"]}, err
	})
	stop := start(t, relayConfig(e.pool, e.schema, []relay.Stream{{Name: "webhook-unrouted", BucketHi: 1023, Indexes: []string{outbox.MessagePrefix + "*"}, Sink: u}}))
	schematest.Eventually(t, 15*time.Second, "unrouted passed m1", func() bool {
		var ok bool
		e.pool.QueryRow(ctx, `SELECT bool_and(pg_visible_in_snapshot(e.xid, p.done_snapshot)) FROM "`+e.schema+`".events e, "`+e.schema+`".progress p WHERE p.stream = 'webhook-unrouted'`).Scan(&ok)
		return ok
	})
	stop()
	conn.Close(ctx) // relay A stopped, d removed from its configuration
	schematest.Eventually(t, 10*time.Second, "drop webhook-d", func() bool {
		return relay.DropStream(ctx, e.pool, e.schema, "webhook-d", "alice") == nil
	})
	n, err := relay.DeleteAcknowledged(ctx, e.pool, e.schema, time.Nanosecond, 100)
	if d := e.delivery(t, "d", "m1"); d.State == "" {
		t.Fatalf("m1: no ledger row, %d events deleted (%v)", n, err)
	}
}
