package backfill

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// backfillState is the row of the backfills table for one index, owned by
// one run: the run holds the index's backfill lock, a session advisory
// lock, on a connection of its own, and writes its progress on that
// connection, conditional on the row's run_id being its own. A second run
// of the index is refused while the lock is held; a run whose connection
// was lost (and so its lock) stops at its next write, which fails, and a
// run whose row another run has taken over since matches no row and stops
// too: a stored key only ever covers rows its own query has written.
type backfillState struct {
	conn  *pgxpool.Conn
	key   string // of the advisory lock
	table string
	index string
	run   string
	after string
}

// backfillRunBy names this process in the row, for the error a second run
// gets.
func backfillRunBy() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

func openBackfillState(ctx context.Context, o Options) (_ *backfillState, err error) {
	id, err := schema.Ident(o.Schema)
	if err != nil {
		return nil, fmt.Errorf("indexer: backfill: schema: %w", err)
	}
	var runID [8]byte
	_, _ = rand.Read(runID[:])
	st := &backfillState{key: o.Schema + "." + o.Index, table: id + ".backfills", index: o.Index, run: hex.EncodeToString(runID[:])}
	if st.conn, err = o.Pool.Acquire(ctx); err != nil {
		return nil, fmt.Errorf("indexer: backfill: %w", err)
	}
	var locked bool
	if err := st.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('outboxd.backfill'), hashtext($1))`, st.key).Scan(&locked); err != nil {
		st.conn.Release()
		return nil, fmt.Errorf("indexer: backfill: lock: %w", err)
	}
	if !locked {
		err := st.running(ctx)
		st.conn.Release()
		return nil, err
	}
	defer func() {
		if err != nil {
			st.close()
		}
	}()

	sum := sha256.Sum256([]byte(o.sourceKey()))
	hash := hex.EncodeToString(sum[:])
	var (
		have     string
		last     *string
		finished bool
	)
	err = st.conn.QueryRow(ctx, `SELECT source_hash, last_key, finished_at IS NOT NULL FROM `+st.table+` WHERE index_name = $1`, o.Index).Scan(&have, &last, &finished)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("indexer: backfill: reading progress: %w", err)
	case !finished && !o.Restart && have != hash && o.def != nil:
		return nil, fmt.Errorf("indexer: backfill: index %s: an unfinished backfill of another definition or ids query (or of a source_sql) stopped after id %q; the documents it loaded may be of another definition: restart to start over", o.Index, deref(last))
	case !finished && !o.Restart && have != hash:
		return nil, fmt.Errorf("indexer: backfill: index %s: an unfinished backfill with another source_sql stopped after id %q; pass the same SQL to continue it, or restart to start over", o.Index, deref(last))
	case !finished && !o.Restart && last != nil:
		st.after = *last
	}
	if st.after != "" {
		// Taken over only as it was read: under the lock nothing else
		// writes it, and the condition says so.
		tag, err := st.conn.Exec(ctx, `UPDATE `+st.table+` SET run_id = $2, run_by = $3, updated_at = now()
WHERE index_name = $1 AND last_key = $4 AND source_hash = $5 AND finished_at IS NULL`, o.Index, st.run, backfillRunBy(), st.after, hash)
		if err == nil && tag.RowsAffected() != 1 {
			err = errors.New("the progress row changed while it was read")
		}
		if err != nil {
			return nil, fmt.Errorf("indexer: backfill: index %s: taking over the stored progress: %w", o.Index, err)
		}
		return st, nil
	}
	_, err = st.conn.Exec(ctx, `INSERT INTO `+st.table+` (index_name, source_hash, run_id, run_by) VALUES ($1, $2, $3, $4)
ON CONFLICT (index_name) DO UPDATE SET source_hash = EXCLUDED.source_hash, run_id = EXCLUDED.run_id, run_by = EXCLUDED.run_by,
	last_key = NULL, rows_read = 0, applied = 0, stale = 0, rejected = 0, started_at = now(), updated_at = now(), finished_at = NULL`,
		o.Index, hash, st.run, backfillRunBy())
	if err != nil {
		return nil, fmt.Errorf("indexer: backfill: storing progress: %w", err)
	}
	return st, nil
}

// running is the error of a run refused because another holds the lock,
// naming that one as its row does.
func (s *backfillState) running(ctx context.Context) error {
	var (
		run, by          *string
		started, updated time.Time
		rows             int64
	)
	err := s.conn.QueryRow(ctx, `SELECT run_id, run_by, started_at, updated_at, rows_read FROM `+s.table+` WHERE index_name = $1`, s.index).
		Scan(&run, &by, &started, &updated, &rows)
	if err != nil {
		return fmt.Errorf("indexer: backfill: index %s: another backfill of this index is running (it has stored no progress yet); one backfill per index at a time", s.index)
	}
	return fmt.Errorf("indexer: backfill: index %s: another backfill of this index is running: run %s by %s, started %s, %d rows stored, last at %s; one backfill per index at a time: wait for it, or stop it and run again to continue it",
		s.index, deref(run), deref(by), started.UTC().Format(time.RFC3339), rows, updated.UTC().Format(time.RFC3339))
}

// write runs one progress write of this run, on the lock's connection.
func (s *backfillState) write(ctx context.Context, sql string, args ...any) error {
	tag, err := s.conn.Exec(ctx, sql, args...)
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("indexer: backfill: storing progress: %w", err)
	case err != nil:
		return fmt.Errorf("indexer: backfill: index %s: storing progress on the connection that holds the backfill lock: %w; stopping (run again to continue after the stored id)", s.index, err)
	case tag.RowsAffected() != 1:
		return fmt.Errorf("indexer: backfill: index %s: another run has taken over the progress of this backfill; stopping without storing more", s.index)
	}
	return nil
}

func (s *backfillState) store(ctx context.Context, last string, rows int64, r batchResult) error {
	return s.write(ctx, `UPDATE `+s.table+` SET last_key = coalesce(nullif($3, ''), last_key), rows_read = rows_read + $4, applied = applied + $5,
	stale = stale + $6, rejected = rejected + $7, updated_at = now() WHERE index_name = $1 AND run_id = $2`,
		s.index, s.run, last, rows, r.applied, r.stale, len(r.rejected))
}

func (s *backfillState) finish(ctx context.Context) error {
	return s.write(ctx, `UPDATE `+s.table+` SET finished_at = now(), updated_at = now() WHERE index_name = $1 AND run_id = $2`, s.index, s.run)
}

// close frees the lock and its connection.
func (s *backfillState) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtext('outboxd.backfill'), hashtext($1))`, s.key); err != nil {
		// Never hand a connection holding the lock back to the pool.
		_ = s.conn.Conn().Close(ctx)
	}
	s.conn.Release()
}
