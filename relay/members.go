package relay

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// Relays with different stream sets share one outbox during every rolling
// deploy that adds a destination. Each relay therefore advertises the
// streams it can lead in <schema>.relays, keyed by the backend pid of its
// membership session (a row counts while that pid holds the member lock).
// The balancer uses it: a stream no other live relay can lead is this
// relay's alone, always led and never handed away, and not counted in the
// fair share of the streams the relays have in common.

// liveRelay matches the rows of <schema>.relays (aliased m) whose session
// holds the member lock $key.
func liveRelay(key string) string {
	return `EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = m.pid AND ` + lockWhere("l", key) + `)`
}

// advertise records on the membership session, before it takes the member
// lock, which streams this relay can lead, and removes the rows of relays
// that are gone. Until the lock is taken the row does not count, so no
// relay ever counts on this one before it is a member.
func (r *Relay) advertise(ctx context.Context, conn *pgx.Conn) error {
	names := make([]string, len(r.cfg.Streams))
	for i, s := range r.cfg.Streams {
		names[i] = s.Name
	}
	var pid int
	err := conn.QueryRow(ctx, `WITH gone AS (
			DELETE FROM `+r.schema+`.relays m WHERE m.pid <> pg_backend_pid() AND NOT `+liveRelay("$2::bigint")+`)
		INSERT INTO `+r.schema+`.relays (pid, streams, client)
		SELECT pg_backend_pid(), $1, coalesce(current_setting('application_name', true), '')
		ON CONFLICT (pid) DO UPDATE SET streams = EXCLUDED.streams, client = EXCLUDED.client, joined_at = now()
		RETURNING pid`, names, r.member).Scan(&pid)
	if err != nil {
		return fmt.Errorf("relay: advertise streams: %w", err)
	}
	r.fleet.setSelf(pid)
	return nil
}

// register creates the progress rows of every configured stream that has
// none, before the relay joins: from then on retention keeps every event
// such a stream has not handled, so a relay that says it serves a stream
// never lets an event of that stream be deleted unseen.
func (r *Relay) register(ctx context.Context) error {
	for _, s := range r.cfg.Streams {
		var indexes, exclude []string
		if len(s.Indexes) > 0 {
			indexes = s.Indexes
		}
		if len(s.Exclude) > 0 {
			exclude = s.Exclude
		}
		if _, err := r.cfg.Pool.Exec(ctx, `INSERT INTO `+r.schema+`.progress (stream, bucket_lo, bucket_hi, indexes, exclude, done_snapshot)
			VALUES ($1, $2, $3, $4, $5, $6::pg_snapshot) ON CONFLICT (stream) DO NOTHING`,
			s.Name, int16(s.BucketLo), int16(s.BucketHi), indexes, exclude, emptySnapshot.String()); err != nil {
			return fmt.Errorf("relay: register stream %s: %w", s.Name, err)
		}
	}
	return nil
}

// fleet is this relay's view of the others: for each of its streams, how
// many other live relays can lead it. It is read at most once per lease
// interval; when it cannot be read, every stream counts as shared (the
// balance of relays with one configuration).
type fleet struct {
	mu     sync.Mutex
	self   int // backend pid of this relay's membership session
	at     time.Time
	others map[string]int
}

func (f *fleet) setSelf(pid int) {
	f.mu.Lock()
	f.self, f.at = pid, time.Time{}
	f.mu.Unlock()
}

// exclusive lists this relay's streams that no other live relay can lead.
func (r *Relay) exclusive(ctx context.Context) map[string]bool {
	f := &r.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.self != 0 && time.Since(f.at) >= r.cfg.LeaseInterval {
		names := make([]string, len(r.cfg.Streams))
		for i, s := range r.cfg.Streams {
			names[i] = s.Name
		}
		rows, err := r.cfg.Pool.Query(ctx, `SELECT s, (SELECT count(*) FROM `+r.schema+`.relays m
				WHERE s = ANY(m.streams) AND m.pid <> $2 AND `+liveRelay("$3::bigint")+`)
			FROM unnest($1::text[]) s`, names, f.self, r.member)
		others := map[string]int{}
		if err == nil {
			for rows.Next() {
				var s string
				var n int
				if err = rows.Scan(&s, &n); err != nil {
					break
				}
				others[s] = n
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("relay: cannot read which relays serve which streams; balancing as if all served all", "err", err)
			}
			others = nil
		}
		f.others, f.at = others, time.Now()
	}
	out := map[string]bool{}
	if f.others == nil {
		return out
	}
	for _, s := range r.cfg.Streams {
		if f.others[s.Name] == 0 {
			out[s.Name] = true
		}
	}
	return out
}

// Leaderless lists this relay's streams that no session has led for at
// least three lease intervals (a handover takes less): their events wait.
// For readiness checks.
func (r *Relay) Leaderless(ctx context.Context) ([]string, error) {
	names := make([]string, len(r.cfg.Streams))
	for i, s := range r.cfg.Streams {
		names[i] = s.Name
	}
	leaders, err := Leaders(ctx, r.cfg.Pool, r.cfg.Schema, names)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unled == nil {
		r.unled = map[string]time.Time{}
	}
	var out []string
	for _, l := range leaders {
		if l.PID != 0 {
			delete(r.unled, l.Stream)
			continue
		}
		since, ok := r.unled[l.Stream]
		if !ok {
			r.unled[l.Stream] = now
			continue
		}
		if now.Sub(since) >= 3*r.cfg.LeaseInterval {
			out = append(out, l.Stream)
		}
	}
	sort.Strings(out)
	return out, nil
}

// LeaderlessError is Leaderless as a readiness check: nil when every
// stream of this relay has a leader.
func (r *Relay) LeaderlessError(ctx context.Context) error {
	names, err := r.Leaderless(ctx)
	if err != nil {
		return err
	}
	if len(names) > 0 {
		return fmt.Errorf("no relay leads stream %s: its events wait", strings.Join(names, ", "))
	}
	return nil
}

// Served reports which of the given streams are registered (retention
// keeps what they have not handled) and can be led by a live relay: a
// stream both hold for will handle its events, now or after a handover.
func Served(ctx context.Context, db outbox.DB, schemaName string, streams []string) (map[string]bool, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT s FROM unnest($1::text[]) s
		WHERE EXISTS (SELECT 1 FROM `+id+`.progress p WHERE p.stream = s)
		  AND EXISTS (SELECT 1 FROM `+id+`.relays m WHERE s = ANY(m.streams) AND `+liveRelay("$2::bigint")+`)`,
		streams, memberKey(schemaName))
	if err != nil {
		return nil, fmt.Errorf("relay: served streams: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("relay: served streams: %w", err)
	}
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}
