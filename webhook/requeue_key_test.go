package webhook_test

import (
	"context"
	"testing"

	"github.com/outboxd/outboxd/webhook"
)

// A waiting row whose key predates the header-safe rule (accepted by the
// old append_message) and whose event retention deleted: RequeueWaiting,
// run at relay start and before every outbox retention, fails whole.
func TestRequeueWaitingFailsOnlyARefusedKey(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.send(t, "d", "good-1", `{}`)
	if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".deliveries (destination, dedupe_key, event_id, payload, state)
		VALUES ('d', 'café-1', 999999, '{}', 'waiting'), ('d', 'k2', 999998, '{}', 'waiting')`); err != nil {
		t.Fatal(err)
	}
	n, err := webhook.RequeueWaiting(ctx, e.pool, e.schema, []string{"d"})
	if err != nil {
		t.Fatalf("requeued %d: %v", n, err)
	}
}
