package relay

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
)

// Leadership is a session-level advisory lock per (schema, stream), held on
// the connection that also writes the stream's progress. PostgreSQL drops
// the lock the moment that session ends (crash, SIGKILL, network loss
// detected), and a relay whose session is gone cannot persist progress, so
// two relays never both advance one stream.
//
// Membership is a shared advisory lock every relay process holds on the
// schema's member key: a relay whose row in <schema>.relays belongs to a
// holder is live (see members.go). A relay with room for a stream it does
// not lead holds the stream's standby key shared on the connection it
// stands by with (see balance.go), so a leader above its share knows whom
// it may hand the stream to.

// streamKey is the stream's 64-bit advisory lock key, standbyKey the key
// its standbys hold shared, and memberKey the key every relay on the
// schema holds shared. 64 bits make a collision between two stream names
// (one of them never led) negligible.
func streamKey(schemaName, stream string) int64 {
	return hash64("outboxd.stream\x00" + schemaName + "\x00" + stream)
}

func standbyKey(schemaName, stream string) int64 {
	return hash64("outboxd.standby\x00" + schemaName + "\x00" + stream)
}

func memberKey(schemaName string) int64 {
	return hash64("outboxd.members\x00" + schemaName)
}

func hash64(s string) int64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return int64(h.Sum64())
}

// lockWhere matches the bigint advisory lock key in pg_locks (aliased t),
// which shows the key's high and low 32 bits as classid and objid, with
// objsubid 1.
func lockWhere(t, key string) string {
	return t + `.locktype = 'advisory' AND ` + t + `.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND ` + t + `.classid = ((` + key + ` >> 32) & 4294967295)::oid AND ` + t + `.objid = (` + key + ` & 4294967295)::oid
	AND ` + t + `.objsubid = 1 AND ` + t + `.granted`
}

func tryLock(ctx context.Context, conn *pgx.Conn, key int64) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok)
	return ok, err
}

func joinMembers(ctx context.Context, conn *pgx.Conn, key int64) error {
	_, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared($1)`, key)
	return err
}

// StreamLeader is who holds a stream's lock, as seen from PostgreSQL.
type StreamLeader struct {
	Stream string
	PID    int    // backend pid of the leader's session; 0 when none
	Client string // client address and application name of that session
}

// Leaders reports which sessions lead the given streams, in one query.
func Leaders(ctx context.Context, db outbox.DB, schemaName string, streams []string) ([]StreamLeader, error) {
	out := make([]StreamLeader, len(streams))
	keys := make([]int64, len(streams))
	for i, s := range streams {
		out[i].Stream = s
		keys[i] = streamKey(schemaName, s)
	}
	rows, err := db.Query(ctx, `SELECT k.i, l.pid, coalesce(host(a.client_addr), 'local') || ' ' || coalesce(a.application_name, '')
		FROM unnest($1::bigint[]) WITH ORDINALITY AS k(key, i)
		JOIN pg_locks l ON l.mode = 'ExclusiveLock' AND `+lockWhere("l", "k.key")+`
		LEFT JOIN pg_stat_activity a ON a.pid = l.pid`, keys)
	if err != nil {
		return nil, fmt.Errorf("relay: leaders: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var i int
		var pid int
		var client string
		if err := rows.Scan(&i, &pid, &client); err != nil {
			return nil, fmt.Errorf("relay: leaders: %w", err)
		}
		out[i-1].PID, out[i-1].Client = pid, client
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("relay: leaders: %w", err)
	}
	return out, nil
}
