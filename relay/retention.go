package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// DeleteAcknowledged removes events older than retention that every stream
// has acknowledged, in batches of batchSize so no lock is held for long.
// An event a stream has not acknowledged is never removed, however old.
// It returns how many events it deleted.
func DeleteAcknowledged(ctx context.Context, db outbox.DB, schemaName string, retention time.Duration, batchSize int) (int64, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return 0, err
	}
	if batchSize <= 0 {
		batchSize = 5000
	}
	var total int64
	for {
		// Acknowledged by every registered stream: visible in its done
		// snapshot. A conservative rule that ignores bucket ranges, so an
		// abandoned stream holds retention back until
		// `outboxd streams drop` removes it (status flags it).
		tag, err := db.Exec(ctx, `DELETE FROM `+id+`.events WHERE id IN (
			SELECT e.id FROM `+id+`.events e
			WHERE e.created_at < now() - make_interval(secs => $1)
			  AND EXISTS (SELECT 1 FROM `+id+`.progress)
			  AND NOT EXISTS (SELECT 1 FROM `+id+`.progress p WHERE NOT pg_visible_in_snapshot(e.xid, p.done_snapshot))
			ORDER BY e.xid, e.id
			LIMIT $2)`, retention.Seconds(), batchSize)
		if err != nil {
			return total, fmt.Errorf("relay: retention: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) || ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
