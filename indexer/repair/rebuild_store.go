package repair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// rebuildRow is the rebuilds table's row of one index name.
type rebuildRow struct {
	Old, New    string
	Phase       string
	Hash        string
	Checkpoints map[string]int64
	Copied      int64
	Rejected    int64
	Samples     []BackfillReject
	KeepUntil   *time.Time
	Dropped     bool
}

type rebuildStore struct {
	pool  *pgxpool.Pool
	table string
	index string
}

// lockRebuild takes the session advisory lock of name's rebuild on a
// dedicated connection: one rebuild, abort or drop of a name at a time. A
// killed process's connection closes and frees it.
func lockRebuild(ctx context.Context, pool *pgxpool.Pool, schemaName, name string) (*rebuildStore, func(), error) {
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
	return &rebuildStore{pool: pool, table: id + ".rebuilds", index: name}, unlock, nil
}

func (s *rebuildStore) load(ctx context.Context) (*rebuildRow, error) {
	var (
		r       rebuildRow
		cps     []byte
		samples []byte
	)
	err := s.pool.QueryRow(ctx, `SELECT old_index, new_index, phase, options_hash, checkpoints, copied, rejected, rejected_samples, keep_until, old_dropped_at IS NOT NULL
FROM `+s.table+` WHERE index_name = $1`, s.index).Scan(&r.Old, &r.New, &r.Phase, &r.Hash, &cps, &r.Copied, &r.Rejected, &samples, &r.KeepUntil, &r.Dropped)
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
func (s *rebuildStore) begin(ctx context.Context, r *rebuildRow) error {
	cps, _ := json.Marshal(r.Checkpoints)
	_, err := s.pool.Exec(ctx, `INSERT INTO `+s.table+` (index_name, old_index, new_index, phase, options_hash, checkpoints)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (index_name) DO UPDATE SET old_index = EXCLUDED.old_index, new_index = EXCLUDED.new_index, phase = EXCLUDED.phase,
	options_hash = EXCLUDED.options_hash, checkpoints = EXCLUDED.checkpoints, copied = 0, total = 0, rejected = 0,
	rejected_samples = '[]', keep_until = NULL, started_at = now(), updated_at = now(), swapped_at = NULL, finished_at = NULL, old_dropped_at = NULL`,
		s.index, r.Old, r.New, r.Phase, r.Hash, cps)
	return s.wrap(err)
}

func (s *rebuildStore) exec(ctx context.Context, set string, args ...any) error {
	_, err := s.pool.Exec(ctx, `UPDATE `+s.table+` SET `+set+`, updated_at = now() WHERE index_name = $1`, append([]any{s.index}, args...)...)
	return s.wrap(err)
}

func (s *rebuildStore) resetCopy(ctx context.Context) error {
	return s.exec(ctx, `copied = 0, rejected = 0, rejected_samples = '[]'`)
}

func (s *rebuildStore) setTotal(ctx context.Context, n int64) error {
	return s.exec(ctx, `total = $2`, n)
}

func (s *rebuildStore) addCopied(ctx context.Context, n int64) error {
	return s.exec(ctx, `copied = copied + $2`, n)
}

// addRejected counts a refused document and keeps the first 20 as samples.
func (s *rebuildStore) addRejected(ctx context.Context, id, reason string) error {
	sample, _ := json.Marshal([]BackfillReject{{ID: id, Reason: reason}})
	return s.exec(ctx, `rejected = rejected + 1,
	rejected_samples = CASE WHEN jsonb_array_length(rejected_samples) < 20 THEN rejected_samples || $2::jsonb ELSE rejected_samples END`, sample)
}

func (s *rebuildStore) setCheckpoints(ctx context.Context, cps map[string]int64) error {
	b, _ := json.Marshal(cps)
	return s.exec(ctx, `checkpoints = $2`, b)
}

func (s *rebuildStore) setPhase(ctx context.Context, phase string) error {
	// The swap may have happened in a run that was killed before storing
	// it; swapped_at then records when it was noticed.
	return s.exec(ctx, `phase = $2, swapped_at = CASE WHEN $2 = 'swapped' THEN coalesce(swapped_at, now()) ELSE swapped_at END`, phase)
}

func (s *rebuildStore) finish(ctx context.Context, keep time.Duration) error {
	var until *time.Time
	if keep > 0 {
		t := time.Now().Add(keep)
		until = &t
	}
	return s.exec(ctx, `phase = 'done', finished_at = now(), keep_until = $2`, until)
}

func (s *rebuildStore) dropped(ctx context.Context) error {
	return s.exec(ctx, `old_dropped_at = now()`)
}

func (s *rebuildStore) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("indexer: rebuild %s: rebuilds table: %w", s.index, err)
}

// RebuildStatus is one row of the rebuilds table, for status pages.
type RebuildStatus struct {
	Index     string    `json:"index"`
	OldIndex  string    `json:"old_index"`
	NewIndex  string    `json:"new_index"`
	Phase     string    `json:"phase"`
	Copied    int64     `json:"copied"`
	Total     int64     `json:"total"`
	Rejected  int64     `json:"rejected"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Rebuilds lists the rebuilds not yet done (copying, catching up or
// swapped), oldest first.
func Rebuilds(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, schemaName string) ([]RebuildStatus, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT index_name, old_index, new_index, phase, copied, total, rejected, started_at, updated_at
FROM `+id+`.rebuilds WHERE phase IN ('copying', 'catching_up', 'swapped') ORDER BY started_at`)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return nil, nil // a schema not migrated yet has no rebuilds
	}
	if err != nil {
		return nil, fmt.Errorf("indexer: rebuilds: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (RebuildStatus, error) {
		var r RebuildStatus
		err := row.Scan(&r.Index, &r.OldIndex, &r.NewIndex, &r.Phase, &r.Copied, &r.Total, &r.Rejected, &r.StartedAt, &r.UpdatedAt)
		return r, err
	})
}
