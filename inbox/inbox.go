// Package inbox is the receiving side of at-least-once delivery: record
// each incoming message by its upstream key in the same transaction as its
// side effect, so the effect happens once however often the message
// arrives.
//
// The key and the source must come from signed data only: Verify returns
// the webhook-id header (covered by the Standard Webhooks signature) as
// the key and the sender whose secret verified the request as the source.
// A URL path or an Idempotency-Key header is not signed: a captured
// request replayed with another one would pass as a new message.
//
//	msg, err := inbox.Verify(senders, r.Header, body, time.Now())
//	if err != nil {
//		return err // 401: not from a known sender
//	}
//	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		first, err := inbox.ReceiveSigned(ctx, tx, msg)
//		if err != nil || !first {
//			return err // a repeat: its effect is already committed
//		}
//		_, err = tx.Exec(ctx, `UPDATE accounts SET credit = credit + $2 WHERE id = $1`, id, amount)
//		return err
//	})
//
// If the transaction rolls back, so does the record: the next delivery is
// first again. Two concurrent deliveries of one key: the second waits for
// the first to commit and gets false. The table is <schema>.inbox (see
// package schema); SQL callers use <schema>.inbox_receive(source, key).
package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/schema"
)

// Querier is what Receive needs: pgx.Tx (the point), *pgx.Conn or a pool.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Receive records (source, key) in the default "outbox" schema's inbox and
// reports whether this is its first delivery.
func Receive(ctx context.Context, tx Querier, source, key string) (first bool, err error) {
	return ReceiveIn(ctx, tx, schema.DefaultName, source, key)
}

// ReceiveIn is Receive for an inbox in another schema.
func ReceiveIn(ctx context.Context, tx Querier, schemaName, source, key string) (first bool, err error) {
	switch {
	case source == "" || len(source) > 255:
		return false, fmt.Errorf("inbox: source: must be 1 to 255 bytes, got %d", len(source))
	case key == "" || len(key) > 512:
		return false, fmt.Errorf("inbox: key: must be 1 to 512 bytes, got %d", len(key))
	}
	id, err := schema.Ident(schemaName)
	if err != nil {
		return false, err
	}
	if err := tx.QueryRow(ctx, `SELECT `+id+`.inbox_receive($1, $2)`, source, key).Scan(&first); err != nil {
		return false, fmt.Errorf("inbox: receive %s/%s: %w", source, key, err)
	}
	return first, nil
}
