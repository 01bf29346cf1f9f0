package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/schema"
)

// Execer is what Purge needs: a pool, *pgx.Conn or pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Purge deletes the inbox records received more than olderThan ago from
// schemaName's inbox and returns how many it deleted. A message delivered
// again after its record is gone counts as a first delivery, so olderThan
// must be longer than the sender can repeat a message: for outboxd, longer
// than the outbox's retention, the ledger's retention and any operator's
// resolve --retry.
func Purge(ctx context.Context, db Execer, schemaName string, olderThan time.Duration) (int64, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return 0, err
	}
	if olderThan <= 0 {
		return 0, errors.New("inbox: purge: olderThan: must be > 0")
	}
	tag, err := db.Exec(ctx, `DELETE FROM `+id+`.inbox WHERE received_at < now() - make_interval(secs => $1)`, olderThan.Seconds())
	if err != nil {
		return 0, fmt.Errorf("inbox: purge: %w", err)
	}
	return tag.RowsAffected(), nil
}
