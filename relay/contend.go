package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// leadingCount counts the streams this process leads.
func (r *Relay) leadingCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// setStanding records the backend pid of the session standing by for
// stream (0: none), so that this relay does not count itself as its own
// standby.
func (r *Relay) setStanding(stream string, pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.standing == nil {
		r.standing = map[string]int{}
	}
	if pid == 0 {
		delete(r.standing, stream)
		return
	}
	r.standing[stream] = pid
}

func (r *Relay) standingPIDs() []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []int32{}
	for _, pid := range r.standing {
		out = append(out, int32(pid))
	}
	return out
}

// contend stands by for stream s while this process has room for it, and
// leads it whenever it can take the lock; without room it takes the
// stream only when nobody else does (see balance.go).
func (r *Relay) contend(ctx context.Context, member *membership, s Stream) error {
	key := streamKey(r.cfg.Schema, s.Name)
	standbyLock := standbyKey(r.cfg.Schema, s.Name)
	var conn *pgx.Conn
	standing := false  // conn holds the stream's standby lock
	failures := 0      // connection failures since the last lock attempt that got an answer
	ledBefore := false // a leadership of s ended without a fatal error in this process
	drop := func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
			conn = nil
		}
		if standing {
			standing = false
			r.setStanding(s.Name, 0)
		}
	}
	defer drop()
	for {
		l := r.look(ctx, member)
		room := l.room(s.Name, r.leadingCount())
		rescue := !room && l.rescue(s.Name, r.cfg.LeaseInterval)
		if !room && !rescue {
			r.setReconnecting(s.Name, nil)
		}
		if conn != nil && (conn.IsClosed() || (standing && !room) || (!room && !rescue)) {
			// Without room this process does not stand by for the stream:
			// holding a connection for it would only use up the server's,
			// and its standby lock would invite a hand-over it would not
			// take. A closed session took its standby lock with it.
			drop()
		}
		if room || rescue {
			if conn == nil {
				c, err := r.connect(ctx)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					r.log.Warn("relay: cannot connect; will retry", "stream", s.Name, "err", err)
					r.setReconnecting(s.Name, err)
					failures++
				}
				conn = c
			}
			if conn != nil && room && !standing {
				if err := standBy(ctx, conn, standbyLock); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					r.log.Warn("relay: cannot stand by for the stream; will retry", "stream", s.Name, "err", err)
					drop()
					r.setReconnecting(s.Name, err)
					failures++
				} else {
					standing = true
					r.setStanding(s.Name, int(conn.PgConn().PID()))
				}
			}
			if conn != nil {
				ok, err := tryLead(ctx, conn, key, standbyLock, standing)
				switch {
				case err != nil && ctx.Err() == nil:
					r.log.Warn("relay: lock attempt failed; will retry", "stream", s.Name, "err", err)
					drop()
					r.setReconnecting(s.Name, err)
					failures++
				case ok:
					if standing {
						standing = false
						r.setStanding(s.Name, 0)
					}
					r.setReconnecting(s.Name, nil)
					failures = 0
					if rescue {
						r.log.Info("relay: leading a stream nobody led or stood by for, beyond this relay's share", "stream", s.Name)
					}
					err := r.lead(ctx, member, conn, s)
					lost := sessionLost(conn, err)
					// Closing the session is what releases the lock: the
					// stream is given up, whatever ended its leadership.
					drop()
					// A lost session or a failed step (a progress write
					// above all) is healed by contending again from the
					// stored position, except on shutdown, where the
					// unstored position is reported, and for what a new
					// leadership would meet again.
					if err != nil && (ctx.Err() != nil || (fatal(err) && !ledBefore)) {
						return err
					}
					if err != nil && fatal(err) {
						// Met while the relay runs (after a database
						// failover, say): that stream stops, shown with
						// its reason, and the others go on; it is tried
						// again after a pause, in case an operator reset it.
						r.log.Error("relay: the stream cannot go on; the other streams continue", "stream", s.Name, "err", err)
						r.setReconnecting(s.Name, err)
						select {
						case <-ctx.Done():
							return nil
						case <-time.After(30 * r.cfg.LeaseInterval):
						}
						continue
					}
					ledBefore = true
					if err != nil {
						if lost {
							r.log.Warn("relay: lost the stream's database session; reconnecting", "stream", s.Name, "err", err)
						} else {
							r.log.Warn("relay: gave up the stream after a failed step; contending for it again", "stream", s.Name, "err", err)
						}
						r.setReconnecting(s.Name, err)
						failures++
					}
				default:
					r.setReconnecting(s.Name, nil)
					failures = 0
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.retryWait(failures)):
		}
	}
}
