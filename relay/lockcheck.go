package relay

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// lockCheck lets a stream's reads vouch for its leadership. A leader whose
// session stores nothing (an idle stream) used to ping that session twice
// per lease interval to learn that it still holds the stream's lock: with
// two streams, four round trips a second, a third of an idle relay's
// CPU. The read loop polls anyway, so its poll asks instead, in the same
// pipeline and without a round trip of its own, whether the lock is held
// by the leader's session: that backend pid, on the server started at the
// same time (after a failover or a restart, the server the pool reaches is
// another one, whose pids say nothing of this session).
//
// That is the property the ping stood for: another relay can lead only
// once the server has released the lock. A session the server still
// holds while the network to it is gone keeps the lock, and nobody else
// leads; its next store fails and the leader gives the stream up then.
// When the reads stop (a paused sink, a failing read), the leader pings
// as before. A check runs only while the leader stores nothing (a store
// shows the session alive; pg_locks copies the server's whole lock
// table, which a busy stream should not ask for), and an answer of "not
// held" ends the leadership at once (lost): the writer takes no page
// after it.
type lockCheck struct {
	key     int64     // the stream's lock
	pid     int32     // pg_backend_pid() of the leader session (a proxy's cancel key may differ)
	started time.Time // pg_postmaster_start_time() of the leader session's server
	every   time.Duration
	lost    chan struct{} // closed by the first answer of "not held"

	mu     sync.Mutex
	at     time.Time // when the last answered check was sent; zero before
	held   bool
	stored time.Time // the leader's last progress store
}

// errLockNotHeld is the cause of a SessionLostError raised by a check that
// found the stream's lock held by another session, or by none.
var errLockNotHeld = errors.New("the stream's lock is not held by this leader's session")

func newLockCheck(ctx context.Context, conn *pgx.Conn, key int64, every time.Duration) (*lockCheck, error) {
	c := &lockCheck{key: key, every: every, lost: make(chan struct{}), stored: time.Now()}
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid(), pg_postmaster_start_time()`).Scan(&c.pid, &c.started); err != nil {
		return nil, err
	}
	return c, nil
}

// due says whether the next read should carry a check: when the leader
// has not stored for half an interval (every, the heartbeat interval), at
// most four times per interval, so that reads a quiet interval apart
// still leave the leader an answer younger than every at each heartbeat.
func (c *lockCheck) due(now time.Time) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return now.Sub(c.stored) >= c.every/2 && now.Sub(c.at) >= c.every/4
}

// noteStore tells the check that the leader stored progress on its
// session at t.
func (c *lockCheck) noteStore(t time.Time) {
	c.mu.Lock()
	c.stored = t
	c.mu.Unlock()
}

// isLost says whether a check found the lock not held by the session.
func (c *lockCheck) isLost() bool {
	if c == nil {
		return false
	}
	select {
	case <-c.lost:
		return true
	default:
		return false
	}
}

// queueIfDue adds the check to a read's pipeline when one is due, and
// returns what reads its answer, in the pipeline's order (a no-op when
// none was queued).
func (c *lockCheck) queueIfDue(b *pgx.Batch) func(pgx.BatchResults) error {
	sent := time.Now()
	if !c.due(sent) {
		return func(pgx.BatchResults) error { return nil }
	}
	b.Queue(`SELECT coalesce(bool_or(l.pid = $1), false) AND pg_postmaster_start_time() = $2
		FROM pg_locks l WHERE l.mode = 'ExclusiveLock' AND `+lockWhere("l", "$3::bigint"),
		c.pid, c.started, c.key)
	return func(br pgx.BatchResults) error { return c.read(br, sent) }
}

// read takes the check's answer from the pipeline; sent is when the read
// was sent, the time the answer speaks for.
func (c *lockCheck) read(br pgx.BatchResults, sent time.Time) error {
	var held bool
	if err := br.QueryRow().Scan(&held); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if sent.After(c.at) {
		c.at, c.held = sent, held
	}
	if !held && !c.isLost() {
		close(c.lost)
	}
	return nil
}

// vouches says whether a check found the lock held by the session within
// the last `within` (a "not held" answer closes lost instead).
func (c *lockCheck) vouches(now time.Time, within time.Duration) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held && now.Sub(c.at) < within
}
