package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ProgressError means the relay could not persist its acknowledgement
// boundary. The stream does not run ahead of what it can record: its
// leader gives it up (closing the session releases the lock) and contends
// for it again, and whoever leads it next (this process or a standby)
// resumes from the last stored position and re-delivers what came after
// it. Only a missing progress row stops the relay (see errProgressRowMissing).
type ProgressError struct {
	Stream string
	Err    error
}

func (e *ProgressError) Error() string {
	return fmt.Sprintf("relay: stream %s: persist progress: %v", e.Stream, e.Err)
}

func (e *ProgressError) Unwrap() error { return e.Err }

// IsProgressError reports whether err is a failure to persist progress.
func IsProgressError(err error) bool {
	var pe *ProgressError
	return errors.As(err, &pe)
}

// PositionError means a stream's stored position cannot be trusted against
// the database it reads, or its progress row disagrees with the configured
// stream; the relay stops rather than skip or replay.
type PositionError struct {
	Stream string
	Reason string
}

func (e *PositionError) Error() string {
	return fmt.Sprintf("relay: stream %s: %s", e.Stream, e.Reason)
}

// loadProgress registers the stream if it is new (starting from the empty
// snapshot, i.e. every retained event) and returns its stored position.
func loadProgress(ctx context.Context, conn *pgx.Conn, schema string, s Stream) (position, error) {
	var indexes []string
	if len(s.Indexes) > 0 {
		indexes = s.Indexes
	}
	var exclude []string
	if len(s.Exclude) > 0 {
		exclude = s.Exclude
	}
	_, err := conn.Exec(ctx, `INSERT INTO `+schema+`.progress (stream, bucket_lo, bucket_hi, indexes, exclude, done_snapshot)
		VALUES ($1, $2, $3, $4, $5, $6::pg_snapshot) ON CONFLICT (stream) DO NOTHING`,
		s.Name, int16(s.BucketLo), int16(s.BucketHi), indexes, exclude, emptySnapshot.String())
	if err != nil {
		return position{}, fmt.Errorf("relay: register stream %s: %w", s.Name, err)
	}
	var done string
	var batch *string
	var cx *uint64
	var cid *int64
	var lo, hi int16
	var stored, storedExclude []string
	err = conn.QueryRow(ctx, `SELECT done_snapshot::text, batch_snapshot::text, cursor_xid, cursor_id, bucket_lo, bucket_hi, indexes, exclude
		FROM `+schema+`.progress WHERE stream = $1`, s.Name).Scan(&done, &batch, &cx, &cid, &lo, &hi, &stored, &storedExclude)
	if err != nil {
		return position{}, fmt.Errorf("relay: load progress of %s: %w", s.Name, err)
	}
	if int(lo) != s.BucketLo || int(hi) != s.BucketHi {
		return position{}, &PositionError{Stream: s.Name, Reason: fmt.Sprintf("stored bucket range %d..%d differs from configured %d..%d; use a new stream name when changing partitions",
			lo, hi, s.BucketLo, s.BucketHi)}
	}
	// A stream's position covers the events its filter selected and no
	// others: reading with another filter under the same name would treat
	// events it never delivered as acknowledged.
	if !sameSet(stored, s.Indexes) {
		return position{}, &PositionError{Stream: s.Name, Reason: fmt.Sprintf("stored index filter %v differs from configured %v; use a new stream name when changing the stream's index filter",
			stored, s.Indexes)}
	}
	// Excluding more only hands events to other streams; excluding less
	// would bring back events this stream's position already passed over
	// without delivering them.
	for _, x := range storedExclude {
		if !slices.Contains(s.Exclude, x) {
			return position{}, &PositionError{Stream: s.Name, Reason: fmt.Sprintf("stored exclusions %v are not all in the configured %v; use a new stream name when a stream stops excluding an index",
				storedExclude, s.Exclude)}
		}
	}
	if !sameSet(storedExclude, s.Exclude) {
		if _, err := conn.Exec(ctx, `UPDATE `+schema+`.progress SET exclude = $2 WHERE stream = $1`, s.Name, exclude); err != nil {
			return position{}, fmt.Errorf("relay: stream %s: store exclusions: %w", s.Name, err)
		}
	}
	var p position
	if p.done, err = ParseSnapshot(done); err != nil {
		return position{}, err
	}
	if batch != nil {
		b, err := ParseSnapshot(*batch)
		if err != nil {
			return position{}, err
		}
		p.batch = &b
		if cx != nil && cid != nil {
			p.cursorXID, p.cursorID = *cx, *cid
		}
	}
	return p, nil
}

// errProgressRowMissing means the stream's progress row went away under its
// leader (an operator dropped the stream): leading it again would register
// it anew and replay every retained event, so the relay stops instead.
var errProgressRowMissing = errors.New("progress row is missing")

// storeProgress persists pos and parks dead letters in one transaction on
// the leader's own connection: if that session (and so its advisory lock)
// is gone, the write fails and the stream is given up instead of advancing.
// Without dead letters the UPDATE is its own transaction: one round trip.
func storeProgress(ctx context.Context, conn *pgx.Conn, schema, schemaName, stream string, pos position, acked int, dead []deadLetter) error {
	var batch any
	var cx, cid any
	if pos.batch != nil {
		batch, cx, cid = pos.batch.String(), pos.cursorXID, pos.cursorID
	}
	sql := `UPDATE ` + schema + `.progress
		SET done_snapshot = $2::pg_snapshot, batch_snapshot = $3::pg_snapshot, cursor_xid = $4, cursor_id = $5,
		    acked_events = acked_events + $6, updated_at = now()
		WHERE stream = $1`
	args := []any{stream, pos.done.String(), batch, cx, cid, acked}
	if len(dead) == 0 {
		return updateProgress(ctx, conn, stream, sql, args)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return &ProgressError{Stream: stream, Err: err}
	}
	defer tx.Rollback(ctx)
	if err := parkDeadLetters(ctx, tx, schemaName, stream, dead); err != nil {
		return &ProgressError{Stream: stream, Err: err}
	}
	if err := updateProgress(ctx, tx, stream, sql, args); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return &ProgressError{Stream: stream, Err: err}
	}
	return nil
}

func updateProgress(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, stream, sql string, args []any) error {
	tag, err := db.Exec(ctx, sql, args...)
	if err != nil {
		return &ProgressError{Stream: stream, Err: err}
	}
	if tag.RowsAffected() != 1 {
		return &ProgressError{Stream: stream, Err: errProgressRowMissing}
	}
	return nil
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}
