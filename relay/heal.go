package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The relay outlives its database sessions. A PostgreSQL restart, a
// failover or pg_terminate_backend ends every session, and with the
// session that held it the stream's advisory lock: the relay then stops
// delivering, drops leadership, reconnects with backoff, takes the lock
// again (unless a standby was faster) and resumes from the stored
// position. A progress write that fails on a session that is still open
// (a statement error, a server turned read-only by a failover) is handled
// the same way: the stream is given up with its session and its lock, and
// led again from what was stored. What was delivered after that position
// is delivered again, which the idempotent sink absorbs; progress never
// advances past a write that failed. A relay started while the database
// is unreachable waits for it. Only what a reconnect cannot fix stops the
// relay (see fatal).

// SessionLostError means the session holding a stream's lock ended; the
// stream is given up and contended for again.
type SessionLostError struct {
	Stream string
	Err    error
}

func (e *SessionLostError) Error() string {
	return fmt.Sprintf("relay: stream %s: lost the database session holding its lock: %v", e.Stream, e.Err)
}

func (e *SessionLostError) Unwrap() error { return e.Err }

// sessionLost reports whether err came with the loss of conn: the server
// or the network ended the session (pgx closes a connection on any such
// failure, and on a query cut short by a timeout). An error on a session
// that is still open is a genuine answer from the database and is not
// healed by reconnecting.
func sessionLost(conn *pgx.Conn, err error) bool {
	var sl *SessionLostError
	return err != nil && (errors.As(err, &sl) || conn.IsClosed())
}

// fatal reports whether err is one that reconnecting and leading again
// cannot fix, so the relay stops: a progress row or position that
// disagrees with the configuration or the database (*PositionError, a
// missing progress row), or a server that refuses this configuration (see
// configRefused). Everything else, lost connections above all, is healed.
func fatal(err error) bool {
	var pe *PositionError
	return errors.As(err, &pe) || errors.Is(err, errProgressRowMissing) || configRefused(err)
}

// IsFatal reports whether err is one that reconnecting cannot fix (see
// Run): a command may retry everything else, as the relay itself does.
func IsFatal(err error) bool { return fatal(err) }

// configRefused reports whether the server refused the configured
// credentials, database, schema or privileges: answers that stay the same
// however often the relay asks.
func configRefused(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	switch {
	case strings.HasPrefix(pg.Code, "28"): // invalid authorization: password, role
		return true
	case pg.Code == "3D000", pg.Code == "3F000": // no such database, no such schema
		return true
	case pg.Code == "42P01", pg.Code == "42501": // outbox not migrated here, permission denied
		return true
	}
	return false
}

// joinWithRetry joins the relays, retrying with backoff (capped at the
// lease interval) whatever a reconnect can fix: a relay started while
// PostgreSQL restarts, or whose first session is cut, waits for it
// instead of exiting. It returns nil once joined, ctx's error on shutdown
// and the error itself when fatal.
func (r *Relay) joinWithRetry(ctx context.Context, m *membership) error {
	for failures := 0; ; failures++ {
		// Registering the streams is a start-up step like joining: a
		// connection lost in either is retried, never a reason to exit.
		err := r.register(ctx)
		if err == nil {
			err = m.join(ctx)
		}
		if err == nil {
			if failures > 0 {
				r.log.Info("relay: joined the relays", "failures", failures)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if fatal(err) {
			return err
		}
		wait := r.retryWait(failures + 1)
		r.log.Warn("relay: cannot join the relays at start; retrying", "failures", failures+1, "retry_in", wait, "err", err)
		for _, s := range r.cfg.Streams {
			r.setReconnecting(s.Name, err)
		}
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// heartbeat checks that the session holding the stream's lock is alive,
// when no read has lately found the lock held by it (see lockCheck): an
// idle leader sends nothing else on it, so without either it would call
// itself leader long after a restart gave its lock to nobody (or to a
// standby). It outlives shutdown's cancellation: a ping cut short would
// close the session that must still store the final position.
//
// A lost session fails the ping at once (the server or the network closed
// it); the timeout only bounds a network that swallows packets. It is at
// least heartbeatTimeout, because pgx closes a session whose ping times out:
// a ping that is merely slow on a loaded machine must not give up a healthy
// leadership and replay the stream.
func (w *streamWriter) heartbeat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(w.r.cfg.LeaseInterval, heartbeatTimeout))
	defer cancel()
	if err := w.conn.Ping(ctx); err != nil {
		w.r.log.Warn("relay: the session holding the stream's lock is gone; giving up leadership", "stream", w.stream.Name, "err", err)
		return &SessionLostError{Stream: w.stream.Name, Err: err}
	}
	return nil
}

const heartbeatTimeout = 2 * time.Second

// slowPings is how many heartbeat intervals an idle leader whose reads
// vouch for its lock goes without pinging its session: 10 s at the default
// lease, so a connection lost without a word (its backend alive) is
// noticed within about 12 s, at a fifth of a round trip a second.
const slowPings = 20

// heartbeatInterval is how often a leader that stored nothing meanwhile
// checks its lock (twice per lease interval), so a lost lock is noticed
// within one interval.
func (c *Config) heartbeatInterval() time.Duration { return c.LeaseInterval / 2 }

// retryWait is how long contend waits before its next attempt: one lease
// interval (jittered) normally; after connection failures an exponential
// backoff from BackoffBase, capped at the lease interval so that the relay
// is back within about one interval of the server answering again.
func (r *Relay) retryWait(failures int) time.Duration {
	if failures == 0 {
		return jitter(r.cfg.LeaseInterval)
	}
	return backoff(r.cfg.BackoffBase, r.cfg.LeaseInterval, failures-1)
}

// membership is this process's shared lock on the relays' member key, on a
// session of its own, which also reads the fleet for the balancer. When
// that session dies with the server the lock goes with it; the next
// reading rejoins, so that the other relays keep counting this one and the
// streams stay fairly shared after a restart.
type membership struct {
	r    *Relay
	mu   sync.Mutex // serializes use of conn
	conn *pgx.Conn
}

func (m *membership) join(ctx context.Context) error {
	conn, err := m.r.connect(ctx)
	if err != nil {
		return err
	}
	if err := m.r.advertise(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return err
	}
	if err := joinMembers(ctx, conn, m.r.member); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("relay: join relays: %w", err)
	}
	m.conn = conn
	return nil
}

// do runs fn on the membership session, rejoining first when this
// process's session is gone, so that the other relays keep counting this
// one after a restart.
func (m *membership) do(ctx context.Context, fn func(conn *pgx.Conn) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conn == nil || m.conn.IsClosed() {
		if err := m.join(ctx); err != nil {
			return err
		}
		m.r.log.Info("relay: rejoined the relays after losing the database session")
	}
	return fn(m.conn)
}

func (m *membership) close(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conn != nil {
		m.conn.Close(context.WithoutCancel(ctx))
	}
}

// setReconnecting records why this process cannot contend for stream now
// (its session was lost; connecting or asking for the lock failed), or
// with nil that it can again: a lock attempt got an answer, taken or not.
func (r *Relay) setReconnecting(stream string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reconnecting == nil {
		r.reconnecting = map[string]error{}
	}
	if err == nil {
		delete(r.reconnecting, stream)
		return
	}
	r.reconnecting[stream] = err
}

// Health fails while some stream has neither a leader's nor a standby's
// session in this process: it lost it (a PostgreSQL restart, a killed
// session) and has not got a new one yet. For readiness checks; a healthy
// process may still lead nothing.
func (r *Relay) Health() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, s := range r.cfg.Streams {
		if err := r.reconnecting[s.Name]; err != nil {
			errs = append(errs, fmt.Errorf("stream %s: no database session, reconnecting: %w", s.Name, err))
		}
	}
	return errors.Join(errs...)
}
