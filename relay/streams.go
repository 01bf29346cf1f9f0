package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// A stream is abandoned when a change of --partitions, --stream or
// --indexes left its progress row behind: no relay leads it and it stores
// no progress. Retention keeps every event such a stream has not
// acknowledged, so the outbox grows until the stream is dropped.

// DefaultAbandonedAfter is how long a stream must go without a leader and
// without stored progress before it counts as abandoned.
const DefaultAbandonedAfter = time.Hour

// ErrStreamLed is wrapped by DropStream when a relay leads the stream.
var ErrStreamLed = errors.New("a relay leads the stream")

// ErrStreamNotFound is wrapped by DropStream when no such stream is registered.
var ErrStreamNotFound = errors.New("no such stream")

// StreamInfo is one registered stream as `outboxd streams list` shows it.
type StreamInfo struct {
	Name         string    `json:"name"`
	BucketLo     int       `json:"bucket_lo"`
	BucketHi     int       `json:"bucket_hi"`
	Indexes      []string  `json:"indexes,omitempty"`
	Position     string    `json:"position"`   // done snapshot
	UpdatedAt    time.Time `json:"updated_at"` // last progress write
	ProgressAge  float64   `json:"progress_age_seconds"`
	LeaderPID    int       `json:"leader_pid"` // 0 when no relay leads it
	LeaderClient string    `json:"leader_client,omitempty"`
	Abandoned    bool      `json:"abandoned"`
}

func abandoned(leaderPID int, progressAge float64, after time.Duration) bool {
	return leaderPID == 0 && progressAge > after.Seconds()
}

// MarkAbandoned sets each stream's Abandoned flag for the threshold after;
// CollectStats marks with DefaultAbandonedAfter.
func (s *Stats) MarkAbandoned(after time.Duration) {
	for i := range s.Streams {
		st := &s.Streams[i]
		st.Abandoned = abandoned(st.LeaderPID, st.ProgressStale, after)
	}
}

// AbandonedStreams lists the names of the streams marked abandoned.
func (s *Stats) AbandonedStreams() []string {
	var out []string
	for _, st := range s.Streams {
		if st.Abandoned {
			out = append(out, st.Stream)
		}
	}
	return out
}

// ListStreams returns every registered stream in name order, marked
// abandoned when it has no leader and no progress for longer than after.
func ListStreams(ctx context.Context, db outbox.DB, schemaName string, after time.Duration) ([]StreamInfo, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT stream, bucket_lo, bucket_hi, coalesce(indexes, '{}'), done_snapshot::text, updated_at,
		extract(epoch FROM now() - updated_at)::float8
		FROM `+id+`.progress ORDER BY stream`)
	if err != nil {
		return nil, fmt.Errorf("relay: streams: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StreamInfo, error) {
		var s StreamInfo
		var lo, hi int16
		err := row.Scan(&s.Name, &lo, &hi, &s.Indexes, &s.Position, &s.UpdatedAt, &s.ProgressAge)
		s.BucketLo, s.BucketHi = int(lo), int(hi)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("relay: streams: %w", err)
	}
	names := make([]string, len(out))
	for i, s := range out {
		names[i] = s.Name
	}
	leaders, err := Leaders(ctx, db, schemaName, names)
	if err != nil {
		return nil, err
	}
	for i, l := range leaders {
		out[i].LeaderPID, out[i].LeaderClient = l.PID, l.Client
		out[i].Abandoned = abandoned(l.PID, out[i].ProgressAge, after)
	}
	return out, nil
}

// DropStream deletes a stream's progress row, so retention no longer waits
// for it, and records who did it in audit_log. It refuses (ErrStreamLed) a
// stream a relay leads: it takes the stream's leadership lock for its
// transaction, so no relay can start leading the stream while it drops it.
// A relay still configured with the stream registers it anew when it next
// leads it, starting from the oldest retained event.
func DropStream(ctx context.Context, db Beginner, schemaName, stream, operator string) error {
	fail := func(err error) error { return fmt.Errorf("relay: drop stream %q: %w", stream, err) }
	id, err := schema.Ident(schemaName)
	if err != nil {
		return err
	}
	switch {
	case strings.TrimSpace(stream) == "":
		return errors.New("relay: drop stream: name: must not be empty")
	case strings.TrimSpace(operator) == "":
		return fail(errors.New("operator: must name who acts (it goes to audit_log)"))
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var free bool
		// A transaction-level lock on the key a leader holds for its
		// session: granted only when no session holds it.
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, streamKey(schemaName, stream)).Scan(&free); err != nil {
			return fail(err)
		}
		if !free {
			who := ""
			if l, err := Leaders(ctx, tx, schemaName, []string{stream}); err == nil && l[0].PID != 0 {
				who = fmt.Sprintf(" (backend pid %d, %s)", l[0].PID, l[0].Client)
			}
			return fail(fmt.Errorf("%w%s: stop it or remove the stream from its configuration first", ErrStreamLed, who))
		}
		// A live relay configured with the stream counts on its progress
		// row to keep what it has not handled (the unrouted stream passes
		// such messages over): between two leaders is no time to drop it.
		var configured bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+id+`.relays m WHERE $1 = ANY(m.streams) AND `+liveRelay("$2::bigint")+`)`,
			stream, memberKey(schemaName)).Scan(&configured); err != nil {
			return fail(err)
		}
		if configured {
			return fail(fmt.Errorf("%w: a live relay is configured with it: remove the stream from its configuration first", ErrStreamLed))
		}
		var s StreamInfo
		var lo, hi int16
		err := tx.QueryRow(ctx, `DELETE FROM `+id+`.progress WHERE stream = $1
			RETURNING bucket_lo, bucket_hi, coalesce(indexes, '{}'), done_snapshot::text, updated_at`, stream).
			Scan(&lo, &hi, &s.Indexes, &s.Position, &s.UpdatedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return fail(ErrStreamNotFound)
		}
		if err != nil {
			return fail(err)
		}
		s.Name, s.BucketLo, s.BucketHi = stream, int(lo), int(hi)
		detail, err := json.Marshal(s)
		if err != nil {
			return fail(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+id+`.audit_log (operator, action, detail) VALUES ($1, 'streams.drop', $2)`,
			operator, detail); err != nil {
			return fail(err)
		}
		return nil
	})
}
