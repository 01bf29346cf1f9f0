package rebuild

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/source"
	"github.com/outboxd/outboxd/schema"
)

// record is the rebuilds table's row of one index name.
type record struct {
	Old, New    string
	Phase       string
	Hash        string
	Checkpoints map[string]int64
	Copied      int64
	Rejected    int64
	Samples     []source.Reject
	KeepUntil   *time.Time
	Dropped     bool
}

type store struct {
	pool  *pgxpool.Pool
	table string
	index string
	// run names this run of the rebuild; the row's run_id says which run
	// owns it, and every state write is conditional on it.
	run string
	// lock is the session holding the advisory lock; state writes and
	// ownership checks go through it, so a run whose session was ended
	// fails there before it changes anything more.
	mu   sync.Mutex
	lock *pgxpool.Conn
}

// ErrLostLock is returned by a run that no longer owns its rebuild: its
// lock's session ended or another run took the rebuild over. It stopped
// before its next state write or Elasticsearch change; run it again.
var ErrLostLock = errors.New("this run lost its rebuild lock")

// openStore takes the session advisory lock of name's rebuild on a
// dedicated connection: one rebuild, abort or drop of a name at a time. A
// killed process's connection closes and frees it.
func openStore(ctx context.Context, pool *pgxpool.Pool, schemaName, name string) (*store, func(), error) {
	if pool == nil {
		return nil, nil, errors.New("indexer: rebuild: pool: no PostgreSQL pool")
	}
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, nil, fmt.Errorf("indexer: rebuild: schema: %w", err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("indexer: rebuild: %w", err)
	}
	key := schemaName + "." + name
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('outboxd.rebuild'), hashtext($1))`, key).Scan(&ok); err != nil {
		conn.Release()
		return nil, nil, fmt.Errorf("indexer: rebuild: lock: %w", err)
	}
	if !ok {
		conn.Release()
		return nil, nil, fmt.Errorf("indexer: rebuild %s: another rebuild, abort or drop of this index is running", name)
	}
	unlock := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtext('outboxd.rebuild'), hashtext($1))`, key); err != nil {
			// Never hand a connection holding the lock back to the pool.
			_ = conn.Conn().Close(ctx)
		}
		conn.Release()
	}
	var run [6]byte
	_, _ = rand.Read(run[:])
	return &store{pool: pool, table: id + ".rebuilds", index: name, run: hex.EncodeToString(run[:]), lock: conn}, unlock, nil
}

// onLock runs f on the lock's session. A cancelled ctx stops it before it
// starts, never midway: pgx closes a connection whose query is cancelled,
// and the lock would then stay held until the server noticed.
func (s *store) onLock(ctx context.Context, f func(ctx context.Context, conn *pgxpool.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return f(qctx, s.lock)
}

// lost wraps a failure of the lock's session, or a row owned by another
// run, as ErrLostLock.
func (s *store) lost(err error) error {
	if err == nil {
		return fmt.Errorf("indexer: rebuild %s: run %s: %w (another run took the rebuild over); stopped", s.index, s.run, ErrLostLock)
	}
	return fmt.Errorf("indexer: rebuild %s: run %s: %w (its session is gone: %v); stopped", s.index, s.run, ErrLostLock, err)
}

// check fails with ErrLostLock unless this run still holds the lock and
// owns the row: called before every Elasticsearch change.
func (s *store) check(ctx context.Context) error {
	var owner *string
	err := s.onLock(ctx, func(ctx context.Context, conn *pgxpool.Conn) error {
		return conn.QueryRow(ctx, `SELECT run_id FROM `+s.table+` WHERE index_name = $1`, s.index).Scan(&owner)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil // nothing stored yet: the lock alone decides
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return s.lost(err)
	case owner == nil || *owner != s.run:
		return s.lost(nil)
	}
	return nil
}

func (s *store) load(ctx context.Context) (*record, error) {
	var (
		r       record
		cps     []byte
		samples []byte
	)
	// Loading takes the row over for this run: the lock is held, so the
	// run that owned it before has lost its session.
	err := s.onLock(ctx, func(ctx context.Context, conn *pgxpool.Conn) error {
		return conn.QueryRow(ctx, `UPDATE `+s.table+` SET run_id = $2 WHERE index_name = $1
RETURNING old_index, new_index, phase, options_hash, checkpoints, copied, rejected, rejected_samples, keep_until, old_dropped_at IS NOT NULL`, s.index, s.run).Scan(&r.Old, &r.New, &r.Phase, &r.Hash, &cps, &r.Copied, &r.Rejected, &samples, &r.KeepUntil, &r.Dropped)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, s.wrap(err)
	}
	if err := json.Unmarshal(cps, &r.Checkpoints); err != nil {
		return nil, fmt.Errorf("indexer: rebuild: stored checkpoints: %w", err)
	}
	_ = json.Unmarshal(samples, &r.Samples)
	return &r, nil
}

// begin replaces the row of a finished or aborted rebuild with a new one.
func (s *store) begin(ctx context.Context, r *record) error {
	cps, _ := json.Marshal(r.Checkpoints)
	var tag pgconn.CommandTag
	err := s.onLock(ctx, func(ctx context.Context, conn *pgxpool.Conn) (err error) {
		tag, err = conn.Exec(ctx, `INSERT INTO `+s.table+` (index_name, old_index, new_index, phase, options_hash, checkpoints, run_id)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (index_name) DO UPDATE SET old_index = EXCLUDED.old_index, new_index = EXCLUDED.new_index, phase = EXCLUDED.phase,
	options_hash = EXCLUDED.options_hash, checkpoints = EXCLUDED.checkpoints, copied = 0, total = 0, rejected = 0,
	rejected_samples = '[]', keep_until = NULL, started_at = now(), updated_at = now(), swapped_at = NULL, finished_at = NULL, old_dropped_at = NULL,
	run_id = EXCLUDED.run_id
WHERE `+s.table+`.run_id IS NOT DISTINCT FROM $7`,
			s.index, r.Old, r.New, r.Phase, r.Hash, cps, s.run)
		return err
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return s.wrap(err)
	case err != nil:
		return s.lost(err)
	case tag.RowsAffected() == 0:
		return s.lost(nil)
	}
	return nil
}

// exec updates the row if this run owns it, on the lock's session.
func (s *store) exec(ctx context.Context, set string, args ...any) error {
	var tag pgconn.CommandTag
	err := s.onLock(ctx, func(ctx context.Context, conn *pgxpool.Conn) (err error) {
		tag, err = conn.Exec(ctx, `UPDATE `+s.table+` SET `+set+`, updated_at = now() WHERE index_name = $1 AND run_id = $2`, append([]any{s.index, s.run}, args...)...)
		return err
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return s.wrap(err)
	case err != nil:
		return s.lost(err)
	case tag.RowsAffected() == 0:
		return s.lost(nil)
	}
	return nil
}

func (s *store) resetCopy(ctx context.Context) error {
	return s.exec(ctx, `copied = 0, rejected = 0, rejected_samples = '[]'`)
}

func (s *store) setTotal(ctx context.Context, n int64) error {
	return s.exec(ctx, `total = $3`, n)
}

func (s *store) addCopied(ctx context.Context, n int64) error {
	return s.exec(ctx, `copied = copied + $3`, n)
}

// addRejected counts a refused document and keeps the first 20 as samples.
func (s *store) addRejected(ctx context.Context, id, reason string) error {
	sample, _ := json.Marshal([]source.Reject{{ID: id, Reason: reason}})
	return s.exec(ctx, `rejected = rejected + 1,
	rejected_samples = CASE WHEN jsonb_array_length(rejected_samples) < 20 THEN rejected_samples || $3::jsonb ELSE rejected_samples END`, sample)
}

func (s *store) setCheckpoints(ctx context.Context, cps map[string]int64) error {
	b, _ := json.Marshal(cps)
	return s.exec(ctx, `checkpoints = $3`, b)
}

func (s *store) setPhase(ctx context.Context, phase string) error {
	// The swap may have happened in a run that was killed before storing
	// it; swapped_at then records when it was noticed.
	return s.exec(ctx, `phase = $3, swapped_at = CASE WHEN $3 = 'swapped' THEN coalesce(swapped_at, now()) ELSE swapped_at END`, phase)
}

func (s *store) finish(ctx context.Context, keep time.Duration) error {
	var until *time.Time
	if keep > 0 {
		t := time.Now().Add(keep)
		until = &t
	}
	return s.exec(ctx, `phase = 'done', finished_at = now(), keep_until = $3`, until)
}

func (s *store) dropped(ctx context.Context) error {
	return s.exec(ctx, `old_dropped_at = now()`)
}

func (s *store) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("indexer: rebuild %s: rebuilds table: %w", s.index, err)
}
