package webhook

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

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
	// One row at a time: a key that append_message refuses (one written
	// before keys had to survive a header round trip) must not hold back
	// the others, nor the relay's start or its retention job.
	rows, err := pool.Query(ctx, `SELECT destination, dedupe_key FROM `+id+`.deliveries d
		WHERE d.state = 'waiting' AND d.destination = ANY($1)
		  AND NOT EXISTS (SELECT 1 FROM `+id+`.events e WHERE e.id = d.event_id)`, destinations)
	if err != nil {
		return 0, fmt.Errorf("webhook: requeue waiting messages: %w", err)
	}
	type rowKey struct{ dest, key string }
	var keys []rowKey
	for rows.Next() {
		var k rowKey
		if err := rows.Scan(&k.dest, &k.key); err != nil {
			rows.Close()
			return 0, fmt.Errorf("webhook: requeue waiting messages: %w", err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("webhook: requeue waiting messages: %w", err)
	}
	var n int64
	for _, k := range keys {
		tag, err := pool.Exec(ctx, `UPDATE `+id+`.deliveries d
			SET event_id = `+id+`.append_message(d.destination, d.dedupe_key, d.payload), updated_at = now()
			WHERE d.destination = $1 AND d.dedupe_key = $2 AND d.state = 'waiting'
			  AND NOT EXISTS (SELECT 1 FROM `+id+`.events e WHERE e.id = d.event_id)`, k.dest, k.key)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "22023" { // invalid_parameter_value: the key
			// The message can never be sent under this key: say so on its
			// row, where `deliveries list` shows it, instead of retrying.
			if _, ferr := pool.Exec(ctx, `UPDATE `+id+`.deliveries SET state = 'failed', finished_at = now(), updated_at = now(),
				last_error = 'cannot be sent again: ' || $3 WHERE destination = $1 AND dedupe_key = $2 AND state = 'waiting'`,
				k.dest, k.key, pgErr.Message); ferr != nil {
				return n, fmt.Errorf("webhook: requeue waiting messages: %w", ferr)
			}
			continue
		}
		if err != nil {
			return n, fmt.Errorf("webhook: requeue waiting messages: %w", err)
		}
		n += tag.RowsAffected()
	}
	return n, nil
}
