package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// An earlier release claimed a key in a transaction of its own and wrote
// in a second one, fenced by the claim's token. These helpers play such a
// writer, so tests can leave a committed PROCESSING claim behind (an owner
// that died, or one still running during a rolling deploy).

// ErrLeaseLost means the claim was taken over; the fenced owner must not write.
var ErrLeaseLost = errors.New("tutorials: idempotency claim was taken over by another request")

// Claim commits a claim on its own.
func (k *Keys) Claim(ctx context.Context, userID, key, method, path, hash string) (claim, error) {
	return k.claim(ctx, k.pool, userID, key, method, path, hash)
}

// commit is the fenced owner's write: it runs op only while the claim with
// token is still PROCESSING, holding the key's row.
func (s *Server) commit(ctx context.Context, user, key, token string, op operation) (result, []byte, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return result{}, nil, err
	}
	defer tx.Rollback(ctx)
	var one int
	err = tx.QueryRow(ctx, `SELECT 1 FROM `+s.keys.table+`
		WHERE user_id = $1 AND key = $2 AND lock_token = $3 AND status = 'PROCESSING'
		FOR UPDATE`, user, key, token).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return result{}, nil, ErrLeaseLost
	}
	if err != nil {
		return result{}, nil, fmt.Errorf("hold key: %w", err)
	}
	res, body, err := s.apply(ctx, tx, user, key, token, op)
	if err != nil {
		return result{}, nil, err
	}
	return res, body, tx.Commit(ctx)
}
