package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// Key statuses, as stored.
const (
	StatusProcessing = "PROCESSING"
	StatusSuccess    = "SUCCESS"
	StatusFailed     = "FAILED"
)

// Keys stores idempotency keys in one schema.
type Keys struct {
	pool  *pgxpool.Pool
	table string // quoted schema.table
	ttl   time.Duration
	lease time.Duration
}

// claimKind is what a request learned by claiming its key.
type claimKind int

const (
	// claimed: this request owns the key and must do the work.
	claimed claimKind = iota + 1
	// replay: the work was done; answer with the stored response.
	replay
	// payloadConflict: the key was used for a different request.
	payloadConflict
	// busy: another request holds the key and its lease is live.
	busy
)

// claim is the result of Keys.Claim.
type claim struct {
	kind      claimKind
	duplicate bool   // the key already existed (a retry, a double click, a replay)
	token     string // for claimed
	status    int    // for replay
	body      []byte // for replay
	resource  string // for replay
	retryIn   time.Duration
}

// requestHash is SHA-256 over method, path and the normalized payload, so
// one key reused on another endpoint or with other content never replays.
func requestHash(method, path string, normalized []byte) string {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{'\n'})
	h.Write([]byte(path))
	h.Write([]byte{'\n'})
	h.Write(normalized)
	return hex.EncodeToString(h.Sum(nil))
}

// normalize re-encodes a JSON payload with sorted keys and no insignificant
// whitespace, so {"b":1, "a":2} and {"a":2,"b":1} hash alike. Numbers keep
// their text (UseNumber) so 1.0 and 1 stay different, as the client sent them.
func normalize(payload []byte) ([]byte, error) {
	if len(payload) == 0 {
		return []byte("null"), nil
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// db is what a claim runs on: the request's transaction (or the pool).
type db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// claimIn makes the request the owner of (userID, key) inside tx, the
// transaction that will also hold the business write, or says why not.
//
// A transaction-level advisory lock on the key comes first: held, another
// request with this key is working on it right now, and this one gets busy
// (409) at once instead of queueing behind it. The lock ends with that
// request's transaction however it ends, so a request cut off by a
// database restart or a dropped connection leaves nothing behind: its
// uncommitted claim rolls back with its write and a retry runs at once.
func (k *Keys) claimIn(ctx context.Context, tx pgx.Tx, userID, key, method, path, hash string) (claim, error) {
	// A few tries, briefly apart: a session killed with its request is
	// gone for its client a moment before its server process lets go of
	// its locks, and the client's retry must not be told busy for that.
	for try := 0; ; try++ {
		var free bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, k.lockKey(userID, key)).Scan(&free); err != nil {
			return claim{}, fmt.Errorf("tutorials: lock key: %w", err)
		}
		if free {
			return k.claim(ctx, tx, userID, key, method, path, hash)
		}
		if try == 4 {
			return claim{kind: busy, duplicate: true, retryIn: time.Second}, nil
		}
		select {
		case <-ctx.Done():
			return claim{}, fmt.Errorf("tutorials: lock key: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// lockKey is the advisory lock key of (userID, key) in this table.
func (k *Keys) lockKey(userID, key string) int64 {
	h := fnv.New64a()
	h.Write([]byte("outboxd.idempotency\x00" + k.table + "\x00" + userID + "\x00" + key))
	return int64(h.Sum64())
}

// claim inserts the key as PROCESSING with INSERT ... ON CONFLICT DO
// NOTHING, so the primary key, not a prior SELECT, decides the winner. A
// loser reads the row: same hash and SUCCESS replays; other hash is a
// conflict. A FAILED key or an expired key is taken over with an UPDATE
// that repeats those conditions, so two takers cannot both win. A
// committed PROCESSING row is a claim an earlier release committed on its
// own before its write: it is busy while its lease lasts and taken over
// once the lease runs out (its owner died).
func (k *Keys) claim(ctx context.Context, db db, userID, key, method, path, hash string) (claim, error) {
	duplicate := false
	for range 5 {
		token := newToken()
		tag, err := db.Exec(ctx, `INSERT INTO `+k.table+`
			(user_id, key, method, path, request_hash, status, lock_token, locked_until, expires_at)
			VALUES ($1, $2, $3, $4, $5, 'PROCESSING', $6, now() + make_interval(secs => $7), now() + make_interval(secs => $8))
			ON CONFLICT (user_id, key) DO NOTHING`,
			userID, key, method, path, hash, token, k.lease.Seconds(), k.ttl.Seconds())
		if err != nil {
			return claim{}, fmt.Errorf("tutorials: claim key: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return claim{kind: claimed, duplicate: duplicate, token: token}, nil
		}
		duplicate = true

		var (
			storedHash, status string
			respStatus         *int32
			respBody           []byte
			resource           *string
			expired, leaseOver bool
			retryIn            float64
		)
		err = db.QueryRow(ctx, `SELECT request_hash, status, response_status, response_body, resource_id,
				expires_at <= now(), coalesce(locked_until <= now(), true),
				greatest(0, extract(epoch FROM coalesce(locked_until, now()) - now()))::float8
			FROM `+k.table+` WHERE user_id = $1 AND key = $2`, userID, key).
			Scan(&storedHash, &status, &respStatus, &respBody, &resource, &expired, &leaseOver, &retryIn)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // removed by the expiry job in between: claim afresh
		}
		if err != nil {
			return claim{}, fmt.Errorf("tutorials: read key: %w", err)
		}
		takeOver := expired ||
			(storedHash == hash && (status == StatusFailed || (status == StatusProcessing && leaseOver)))
		if !takeOver {
			switch {
			case storedHash != hash:
				return claim{kind: payloadConflict, duplicate: true}, nil
			case status == StatusSuccess:
				c := claim{kind: replay, duplicate: true, body: respBody}
				if respStatus != nil {
					c.status = int(*respStatus)
				}
				if resource != nil {
					c.resource = *resource
				}
				return c, nil
			default:
				return claim{kind: busy, duplicate: true, retryIn: time.Duration(retryIn * float64(time.Second))}, nil
			}
		}
		tag, err = db.Exec(ctx, `UPDATE `+k.table+` SET
				method = $3, path = $4, request_hash = $5, status = 'PROCESSING',
				lock_token = $6, locked_until = now() + make_interval(secs => $7),
				response_status = NULL, response_body = NULL, resource_id = NULL, updated_at = now(),
				created_at = CASE WHEN expires_at <= now() THEN now() ELSE created_at END,
				expires_at = CASE WHEN expires_at <= now() THEN now() + make_interval(secs => $8) ELSE expires_at END
			WHERE user_id = $1 AND key = $2 AND (expires_at <= now() OR (request_hash = $5 AND
				(status = 'FAILED' OR (status = 'PROCESSING' AND coalesce(locked_until <= now(), true)))))`,
			userID, key, method, path, hash, token, k.lease.Seconds(), k.ttl.Seconds())
		if err != nil {
			return claim{}, fmt.Errorf("tutorials: take over key: %w", err)
		}
		if tag.RowsAffected() == 1 {
			// An expired key is a new operation, not a duplicate.
			return claim{kind: claimed, duplicate: !expired, token: token}, nil
		}
		// Someone else changed the row between our read and our update:
		// read it again.
	}
	return claim{}, fmt.Errorf("tutorials: key %q: claim did not settle after 5 attempts", key)
}

// succeed stores the response inside the business transaction: the key
// reads SUCCESS exactly when the business row and its outbox event exist.
func (k *Keys) succeed(ctx context.Context, tx pgx.Tx, userID, key, token string, status int, body []byte, resource string) error {
	tag, err := tx.Exec(ctx, `UPDATE `+k.table+` SET status = 'SUCCESS', response_status = $4, response_body = $5,
			resource_id = $6, lock_token = NULL, locked_until = NULL, updated_at = now()
		WHERE user_id = $1 AND key = $2 AND lock_token = $3`,
		userID, key, token, status, body, nullString(resource))
	if err != nil {
		return fmt.Errorf("tutorials: complete key: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return errors.New("tutorials: complete key: the claim is gone")
	}
	return nil
}

// fail marks the key FAILED with the response the client got, in the
// request's transaction after its write was rolled back to a savepoint. A
// FAILED key may be retried with the same payload; nothing was written.
func (k *Keys) fail(ctx context.Context, tx pgx.Tx, userID, key, token string, status int, body []byte) error {
	_, err := tx.Exec(ctx, `UPDATE `+k.table+` SET status = 'FAILED', response_status = $4, response_body = $5,
			lock_token = NULL, locked_until = NULL, updated_at = now()
		WHERE user_id = $1 AND key = $2 AND lock_token = $3`,
		userID, key, token, status, body)
	if err != nil {
		return fmt.Errorf("tutorials: fail key: %w", err)
	}
	return nil
}

// DeleteExpiredKeys removes expired keys from schemaName's
// idempotency_keys; see (*Keys).DeleteExpiredKeys.
func DeleteExpiredKeys(ctx context.Context, pool *pgxpool.Pool, schemaName string) (int64, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return 0, err
	}
	k := &Keys{pool: pool, table: id + ".idempotency_keys"}
	return k.DeleteExpiredKeys(ctx)
}

// DeleteExpiredKeys removes keys past their expiry, in batches so the job
// never holds many row locks at once. A PROCESSING key is kept while its
// lease is live. It returns how many keys it removed.
func (k *Keys) DeleteExpiredKeys(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := k.pool.Exec(ctx, `DELETE FROM `+k.table+` WHERE ctid = ANY (ARRAY(
			SELECT ctid FROM `+k.table+`
			WHERE expires_at <= now() AND (status <> 'PROCESSING' OR coalesce(locked_until <= now(), true))
			LIMIT 5000))`)
		if err != nil {
			return total, fmt.Errorf("tutorials: delete expired keys: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 5000 {
			return total, nil
		}
	}
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
