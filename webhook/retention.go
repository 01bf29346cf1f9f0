package webhook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// DefaultLedgerRetention is how long a final ledger row is kept after its
// message finished.
const DefaultLedgerRetention = 30 * 24 * time.Hour

// PurgeLedger deletes, in batches of batchSize, the ledger rows that are
// final (delivered, failed, skipped) and finished more than olderThan ago,
// payload and all. Unknown, waiting, reserved and retrying rows are kept
// however old: they wait for an operator or a relay.
//
// The ledger is what keeps a replayed message from being sent twice, so
// olderThan must be longer than every way a message comes back: the
// outbox's retention (a stream registered anew, after `outboxd streams
// drop` or a new destination, reads every retained event), and
// `deliveries resolve --retry`, which needs the row. outboxd relay refuses
// a --ledger-retention shorter than its --retention. Whatever the window,
// a row is kept while the outbox still holds its message or one of its
// duplicates: a stream lagging behind keeps events past --retention, and a
// stream registered anew would read such an event again and, without the
// row, send it a second time.
func PurgeLedger(ctx context.Context, pool *pgxpool.Pool, schemaName string, olderThan time.Duration, batchSize int) (int64, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return 0, err
	}
	if olderThan <= 0 {
		return 0, errors.New("webhook: purge ledger: olderThan: must be > 0")
	}
	if batchSize <= 0 {
		batchSize = 5000
	}
	var total int64
	for {
		tag, err := pool.Exec(ctx, `DELETE FROM `+id+`.deliveries WHERE ctid = ANY(ARRAY(
			SELECT ctid FROM `+id+`.deliveries
			WHERE state IN ('delivered', 'failed', 'skipped') AND finished_at < now() - make_interval(secs => $1)
			  AND NOT EXISTS (SELECT 1 FROM `+id+`.events e WHERE e.id = ANY(event_id || duplicates))
			LIMIT $2))`, olderThan.Seconds(), batchSize)
		if err != nil {
			return total, fmt.Errorf("webhook: purge ledger: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) || ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
