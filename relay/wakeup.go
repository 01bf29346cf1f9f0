package relay

import (
	"context"
	"sync"
	"time"
)

// wakeChannel is the NOTIFY channel of <schema>.enable_wakeup(); the
// payload is the schema name, so one listener serves any number of
// outboxes in a database.
const wakeChannel = "outboxd_wake"

// waker fans a notification out to every stream's read loop. Polling stays
// the backstop: a lost notification only costs up to MaxPollInterval.
type waker struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

func (w *waker) subscribe() chan struct{} {
	c := make(chan struct{}, 1)
	w.mu.Lock()
	if w.subs == nil {
		w.subs = map[chan struct{}]struct{}{}
	}
	w.subs[c] = struct{}{}
	w.mu.Unlock()
	return c
}

func (w *waker) unsubscribe(c chan struct{}) {
	w.mu.Lock()
	delete(w.subs, c)
	w.mu.Unlock()
}

func (w *waker) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for c := range w.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// listen holds a LISTEN session and wakes the read loops on every
// notification for this schema, reconnecting with backoff.
func (r *Relay) listen(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		conn, err := r.connect(ctx)
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+wakeChannel)
			for err == nil {
				n, werr := conn.WaitForNotification(ctx)
				if werr != nil {
					err = werr
					break
				}
				failures = 0
				if n.Payload == r.cfg.Schema {
					r.waker.wake()
				}
			}
			conn.Close(context.WithoutCancel(ctx))
		}
		if ctx.Err() != nil {
			return
		}
		d := backoff(r.cfg.BackoffBase, r.cfg.BackoffMax, failures)
		failures++
		r.log.Warn("relay: wake-up listener lost; polling continues", "retry_in", d, "err", err)
		if !sleep(ctx, d) {
			return
		}
	}
}

// sleepOrWake waits d, or less if woken.
func sleepOrWake(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
	}
	return true
}
