package relay

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// Relays with different stream sets share one outbox during every rolling
// deploy that adds a destination. Each relay therefore advertises the
// streams it can lead in <schema>.relays, keyed by the backend pid of its
// membership session (a row counts while that pid holds the member lock).
// The balancer (balance.go) counts every share per stream from it: which
// live relays can lead which streams.

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

// fleet is this relay's reading of the others (see look), kept for a
// quarter lease interval (every stream's contender and leader consult it
// once per lease interval), or a whole one after a failed reading.
type fleet struct {
	self atomic.Int64 // backend pid of this relay's membership session

	mu    sync.Mutex
	until time.Time // when last is to be read again
	last  look
	unled map[string]time.Time // this relay's streams seen without a leader, since when
}

func (f *fleet) setSelf(pid int) { f.self.Store(int64(pid)) }

// look returns the fleet as this relay balances by it. When it cannot be
// read this relay balances as if alone (a share of all its streams, no
// hand-over): the locks still keep every stream to one leader.
func (r *Relay) look(ctx context.Context, member *membership) look {
	f := &r.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Now().Before(f.until) {
		return f.last
	}
	l, err := r.readFleet(ctx, member)
	keep := r.cfg.LeaseInterval / 4
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("relay: cannot read which relays serve and lead which streams; balancing as if alone", "err", err)
		}
		l = look{share: len(r.cfg.Streams)}
		keep = r.cfg.LeaseInterval
	}
	if f.unled == nil {
		f.unled = map[string]time.Time{}
	}
	now := time.Now()
	l.unled = map[string]time.Time{}
	for _, s := range r.cfg.Streams {
		switch {
		case !l.ok:
		case l.led[s.Name]:
			delete(f.unled, s.Name)
		default:
			if _, ok := f.unled[s.Name]; !ok {
				f.unled[s.Name] = now
			}
		}
		if t, ok := f.unled[s.Name]; ok {
			l.unled[s.Name] = t
		}
	}
	f.last, f.until = l, now.Add(keep)
	return l
}

// readFleet reads, on the membership session (rejoining first if it is
// gone), which streams every live relay can lead, and for each of this
// relay's streams whether a session leads it and whether another relay
// stands by for it.
func (r *Relay) readFleet(ctx context.Context, member *membership) (look, error) {
	names := make([]string, len(r.cfg.Streams))
	keys := make([]int64, len(r.cfg.Streams))
	standbys := make([]int64, len(r.cfg.Streams))
	for i, s := range r.cfg.Streams {
		names[i] = s.Name
		keys[i] = streamKey(r.cfg.Schema, s.Name)
		standbys[i] = standbyKey(r.cfg.Schema, s.Name)
	}
	mine := r.standingPIDs()
	l := look{ok: true, exclusive: map[string]bool{}, led: map[string]bool{}, standby: map[string]bool{}}
	err := member.do(ctx, func(conn *pgx.Conn) error {
		self := int(r.fleet.self.Load())
		b := &pgx.Batch{}
		b.Queue(`SELECT m.pid, m.streams FROM `+r.schema+`.relays m WHERE `+liveRelay("$1::bigint"), r.member)
		b.Queue(`WITH l AS MATERIALIZED (
				SELECT pid, mode, classid, objid FROM pg_locks
				WHERE locktype = 'advisory' AND objsubid = 1 AND granted
				  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
			k AS (SELECT s, ((sk >> 32) & 4294967295)::oid AS sc, (sk & 4294967295)::oid AS so,
					((wk >> 32) & 4294967295)::oid AS wc, (wk & 4294967295)::oid AS wo
				FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(s, sk, wk))
			SELECT k.s, ld.pid IS NOT NULL,
				EXISTS (SELECT 1 FROM l WHERE l.classid = k.wc AND l.objid = k.wo AND l.mode = 'ShareLock'
					AND l.pid IS DISTINCT FROM ld.pid AND l.pid <> ALL($4::int[]))
			FROM k LEFT JOIN LATERAL (SELECT l.pid FROM l
				WHERE l.classid = k.sc AND l.objid = k.so AND l.mode = 'ExclusiveLock' LIMIT 1) ld ON true`,
			names, keys, standbys, mine)
		res := conn.SendBatch(ctx, b)
		defer res.Close()
		rows, err := res.Query()
		if err != nil {
			return err
		}
		relays := [][]string{names}
		others := map[string]bool{}
		found := false
		for rows.Next() {
			var pid int
			var streams []string
			if err := rows.Scan(&pid, &streams); err != nil {
				return err
			}
			if pid == self {
				found = true
				continue
			}
			relays = append(relays, streams)
			for _, s := range streams {
				others[s] = true
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = res.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var s string
			var led, standby bool
			if err := rows.Scan(&s, &led, &standby); err != nil {
				return err
			}
			l.led[s], l.standby[s] = led, standby
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, s := range names {
			if !others[s] {
				l.exclusive[s] = true
			}
		}
		l.share = share(fairLoad(relays, 0))
		if !found {
			// Another relay's clean-up of rows whose relay is gone can
			// meet this one's row before its lock was taken: the others
			// would not count this relay. Advertise again.
			if err := res.Close(); err != nil {
				return err
			}
			r.log.Info("relay: its row in the relays table was missing; advertising its streams again")
			return r.advertise(ctx, conn)
		}
		return nil
	})
	return l, err
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
