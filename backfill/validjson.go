package backfill

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/source"
)

// ValidJSON reports whether the document column of sourceSQL is of type
// json or jsonb, without running the query: PostgreSQL then validated
// every document, and the sink Run writes to may be built with
// indexer.Options.JSONB, which does not parse them again (most of the
// sink's own CPU for documents of a kilobyte). A text column must not: a
// document that is not JSON would reach Elasticsearch instead of being
// rejected by the sink with "invalid JSON".
func ValidJSON(ctx context.Context, pool *pgxpool.Pool, sourceSQL string) (bool, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return false, fmt.Errorf("indexer: backfill: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	shape, err := source.Describe(ctx, tx, sourceSQL)
	if err != nil {
		return false, err
	}
	return shape.ValidJSON(), nil
}
