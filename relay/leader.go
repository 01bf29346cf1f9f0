package relay

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
)

// Leadership is a session-level advisory lock per (schema, stream), held on
// the connection that also writes the stream's progress. PostgreSQL drops
// the lock the moment that session ends (crash, SIGKILL, network loss
// detected), and a relay whose session is gone cannot persist progress, so
// two relays never both advance one stream.
//
// Membership is a shared advisory lock every relay process holds on
// (schema, 0); counting its holders gives the number of live relays, from
// which each derives its fair share of the partitions.

func lockKeys(schemaName, stream string) (int32, int32) {
	return hash31("outboxd:" + schemaName), hash31(stream) | 1
}

// hash31 is a stable, positive 31-bit hash; positive so that pg_locks'
// oid columns compare to it without sign games.
func hash31(s string) int32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return int32(h.Sum32() & 0x7fffffff)
}

func tryLock(ctx context.Context, conn *pgx.Conn, k1, k2 int32) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, k1, k2).Scan(&ok)
	return ok, err
}

func joinMembers(ctx context.Context, conn *pgx.Conn, k1 int32) error {
	_, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared($1, 0)`, k1)
	return err
}

// countMembers counts live relay processes on this schema.
func countMembers(ctx context.Context, conn *pgx.Conn, k1 int32) (int, error) {
	var n int
	err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND classid = $1::bigint::oid AND objid = 0 AND objsubid = 2 AND granted`, int64(k1)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("relay: count relays: %w", err)
	}
	return n, nil
}

// StreamLeader is who holds a stream's lock, as seen from PostgreSQL.
type StreamLeader struct {
	Stream string
	PID    int    // backend pid of the leader's session; 0 when none
	Client string // client address and application name of that session
}

// Leaders reports which sessions lead the given streams.
func Leaders(ctx context.Context, db DB, schemaName string, streams []string) ([]StreamLeader, error) {
	out := make([]StreamLeader, 0, len(streams))
	for _, s := range streams {
		k1, k2 := lockKeys(schemaName, s)
		l := StreamLeader{Stream: s}
		err := db.QueryRow(ctx, `SELECT l.pid, coalesce(host(a.client_addr), 'local') || ' ' || coalesce(a.application_name, '')
			FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid AND l.objsubid = 2 AND l.granted AND l.mode = 'ExclusiveLock'
			LIMIT 1`, int64(k1), int64(k2)).Scan(&l.PID, &l.Client)
		if err != nil && err != pgx.ErrNoRows {
			return nil, fmt.Errorf("relay: leaders: %w", err)
		}
		out = append(out, l)
	}
	return out, nil
}
