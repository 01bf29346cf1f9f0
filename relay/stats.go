package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// StreamStats is what an operator needs to know about one stream.
type StreamStats struct {
	Stream        string    `json:"stream"`
	BucketLo      int       `json:"bucket_lo"`
	BucketHi      int       `json:"bucket_hi"`
	Backlog       int64     `json:"backlog"`            // committed events not yet acknowledged
	OldestAge     float64   `json:"oldest_age_seconds"` // age of the oldest of them; 0 when none
	Acknowledged  int64     `json:"acknowledged"`       // events acknowledged since the stream began
	Position      string    `json:"position"`           // done snapshot
	UpdatedAt     time.Time `json:"updated_at"`         // last progress write
	LeaderPID     int       `json:"leader_pid"`         // 0 when no relay leads the stream
	LeaderClient  string    `json:"leader_client,omitempty"`
	ProgressStale float64   `json:"progress_age_seconds"`
	Abandoned     bool      `json:"abandoned"` // no leader and no progress for long: see MarkAbandoned
	// Paused is why the sink fails this stream's writes as a whole (an
	// outage, or a configuration it refuses), as seen by the relay process
	// that reports it (see Relay.Paused); empty while events flow.
	Paused string `json:"paused,omitempty"`
}

// DeadLetterStats summarizes parked events per index.
type DeadLetterStats struct {
	Index      string `json:"index"`
	Parked     int64  `json:"parked"`
	LastReason string `json:"last_reason"`
}

// Stats is one look at the outbox: per stream backlog and position, and
// parked dead letters. It reads only; any process may call it.
type Stats struct {
	Streams     []StreamStats     `json:"streams"`
	DeadLetters []DeadLetterStats `json:"dead_letters"`
	Events      int64             `json:"events_retained"`
	TakenAt     time.Time         `json:"taken_at"`
}

// CollectStats computes Stats for the outbox in schemaName.
func CollectStats(ctx context.Context, db outbox.DB, schemaName string) (*Stats, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	st := &Stats{TakenAt: time.Now()}
	// The backlog is what is visible now but not covered by the stream's
	// position: not in done, and not at or before the cursor of its batch.
	rows, err := db.Query(ctx, `
SELECT p.stream, p.bucket_lo, p.bucket_hi, p.acked_events, p.done_snapshot::text, p.updated_at,
       extract(epoch FROM now() - p.updated_at)::float8,
       b.n, coalesce(extract(epoch FROM now() - b.oldest)::float8, 0)
FROM `+id+`.progress p
CROSS JOIN LATERAL (
  SELECT count(*) AS n, min(e.created_at) AS oldest
  FROM `+id+`.events e
  WHERE e.xid >= pg_snapshot_xmin(p.done_snapshot)
    AND NOT pg_visible_in_snapshot(e.xid, p.done_snapshot)
    AND NOT (p.batch_snapshot IS NOT NULL AND pg_visible_in_snapshot(e.xid, p.batch_snapshot)
             AND (e.xid, e.id) <= (p.cursor_xid, p.cursor_id))
    AND e.bucket BETWEEN p.bucket_lo AND p.bucket_hi
    AND (p.indexes IS NULL OR e.index_name = ANY(p.indexes))
) b
ORDER BY p.stream`)
	if err != nil {
		return nil, fmt.Errorf("relay: stats: %w", err)
	}
	for rows.Next() {
		var s StreamStats
		var lo, hi int16
		if err := rows.Scan(&s.Stream, &lo, &hi, &s.Acknowledged, &s.Position, &s.UpdatedAt, &s.ProgressStale, &s.Backlog, &s.OldestAge); err != nil {
			rows.Close()
			return nil, fmt.Errorf("relay: stats: %w", err)
		}
		s.BucketLo, s.BucketHi = int(lo), int(hi)
		st.Streams = append(st.Streams, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("relay: stats: %w", err)
	}
	names := make([]string, len(st.Streams))
	for i, s := range st.Streams {
		names[i] = s.Stream
	}
	leaders, err := Leaders(ctx, db, schemaName, names)
	if err != nil {
		return nil, err
	}
	for i, l := range leaders {
		st.Streams[i].LeaderPID, st.Streams[i].LeaderClient = l.PID, l.Client
	}
	st.MarkAbandoned(DefaultAbandonedAfter)

	rows, err = db.Query(ctx, `SELECT index_name, count(*),
		(array_agg(reason ORDER BY id DESC))[1]
		FROM `+id+`.dead_letters WHERE status = 'parked' GROUP BY index_name ORDER BY index_name`)
	if err != nil {
		return nil, fmt.Errorf("relay: stats: %w", err)
	}
	st.DeadLetters, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetterStats, error) {
		var d DeadLetterStats
		err := row.Scan(&d.Index, &d.Parked, &d.LastReason)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("relay: stats: %w", err)
	}
	// An estimate: counting a large outbox exactly would scan it.
	if err := db.QueryRow(ctx, `SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = $1::regclass`,
		id+".events").Scan(&st.Events); err != nil {
		return nil, fmt.Errorf("relay: stats: %w", err)
	}
	return st, nil
}

// Backlog is the number of unacknowledged events over all streams.
func (s *Stats) Backlog() int64 {
	var n int64
	for _, st := range s.Streams {
		n += st.Backlog
	}
	return n
}

// OldestBacklogAge is the largest OldestAge over all streams.
func (s *Stats) OldestBacklogAge() time.Duration {
	var m float64
	for _, st := range s.Streams {
		m = max(m, st.OldestAge)
	}
	return time.Duration(m * float64(time.Second))
}
