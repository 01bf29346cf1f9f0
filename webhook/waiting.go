package webhook

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// RequeueWaiting appends again, under the same key, the waiting messages
// of the given destinations whose event the outbox no longer holds
// (retention deleted it while no relay had the destination), so that the
// destination's stream, which a relay serving it has registered, reads and
// delivers them. A waiting message whose event is still retained needs
// nothing: its stream reads it. It returns how many it appended.
func RequeueWaiting(ctx context.Context, pool *pgxpool.Pool, schemaName string, destinations []string) (int64, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return 0, err
	}
	if len(destinations) == 0 {
		return 0, nil
	}
	tag, err := pool.Exec(ctx, `UPDATE `+id+`.deliveries d
		SET event_id = `+id+`.append_message(d.destination, d.dedupe_key, d.payload), updated_at = now()
		WHERE d.state = 'waiting' AND d.destination = ANY($1)
		  AND NOT EXISTS (SELECT 1 FROM `+id+`.events e WHERE e.id = d.event_id)`, destinations)
	if err != nil {
		return 0, fmt.Errorf("webhook: requeue waiting messages: %w", err)
	}
	return tag.RowsAffected(), nil
}
