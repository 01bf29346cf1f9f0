package relay

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// errShutdown means a page was abandoned because shutdown's grace period
// ran out; its events are not acknowledged and will be delivered again.
var errShutdown = errors.New("relay: shutdown before the page was handled")

// streamWriter hands pages to the sink in reading order and persists the
// position after each, so progress only ever covers events with a
// terminal outcome.
type streamWriter struct {
	r      *Relay
	member *membership
	conn   *pgx.Conn
	stream Stream

	acked   position // last stored position
	pending *position
	stored  time.Time
	// readAtStore is the relay's eventsRead at the last store.
	readAtStore int64
	// Handled but not yet stored: progress is coalesced so that a busy
	// stream updates its row a few times a second, not once per page (every
	// update leaves a row version that an open transaction anywhere in the
	// cluster keeps from being cleaned up).
	pendingAcked int
	pendingDead  []deadLetter

	lingerRate float64 // events per second seen by the last linger; the read loop's own
	lock       *lockCheck
}

func (w *streamWriter) run(ctx context.Context) error {
	cfg := w.r.cfg
	m := w.r.metrics
	name := w.stream.Name

	// Writes outlive ctx by ShutdownTimeout so that in-flight work can
	// finish and be acknowledged after the first signal.
	wctx, cancelWrites := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWrites()
	stopGrace := context.AfterFunc(ctx, func() {
		time.AfterFunc(cfg.ShutdownTimeout, cancelWrites)
	})
	defer stopGrace()

	maxBytes := cfg.MaxBatchBytes
	if w.stream.MaxBatchBytes > 0 {
		maxBytes = w.stream.MaxBatchBytes
	}
	lock, err := newLockCheck(ctx, w.conn, streamKey(cfg.Schema, name), cfg.heartbeatInterval())
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return &SessionLostError{Stream: name, Err: err}
	}
	w.lock = lock
	rd := &reader{pool: cfg.Pool, schema: w.r.schema, stream: w.stream, maxDocs: cfg.MaxBatchDocs, maxBytes: maxBytes, pos: w.acked, ledFrom: w.acked.done.Xmax, afterRead: cfg.afterRead, lock: lock}
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	pages := make(chan page, cfg.Prefetch)
	go w.readLoop(readCtx, rd, pages)

	balance := time.NewTicker(cfg.LeaseInterval)
	defer balance.Stop()
	// Armed only while a position waits to be stored: an idle stream
	// has nothing to flush and should not wake up to find that out. A
	// position moved only by empty pages (events of other streams) is due
	// after ProgressInterval, or QuietProgressInterval when no stream here
	// read an event meanwhile; handled events after StoreInterval. Either
	// way it is stored even if no page follows, or an idle stream would
	// hold retention back at its last stored position for good. The
	// timer is re-armed at every turn of the loop (the heartbeat ticks),
	// so a due time that comes nearer is noticed.
	flushTimer := time.NewTimer(cfg.StoreInterval)
	flushTimer.Stop()
	defer flushTimer.Stop()
	var flushAt time.Time // when the armed timer fires; zero when disarmed
	beat := time.NewTicker(cfg.heartbeatInterval())
	pinged := time.Now() // the last heartbeat's answer, or the start
	defer beat.Stop()

	// Up to InFlight pages are at the sink at once (versions make their
	// order irrelevant to the result); they are acknowledged strictly in
	// reading order, so progress never passes a page still in flight.
	var queue []*inflight
	// The stream may be led again (here, after a reconnect) as soon as this
	// returns: no delivery of this term may still be running then.
	defer func() {
		cancelWrites()
		for _, f := range queue {
			<-f.done
		}
	}()
	for {
		if lock.isLost() {
			// Before any page read ahead goes to the sink, which a
			// select among ready cases might otherwise pick first.
			w.r.log.Warn("relay: the stream's lock is no longer held by its session; giving up leadership", "stream", name)
			return &SessionLostError{Stream: name, Err: errLockNotHeld}
		}
		var head chan struct{}
		if len(queue) > 0 {
			head = queue[0].done
		}
		var in <-chan page
		if len(queue) < cfg.InFlight {
			in = pages
		}
		m.pagesInFlight.WithLabelValues(name).Set(float64(len(queue)))
		if w.pending != nil {
			if due := w.storeDue(); flushAt.IsZero() || due.Before(flushAt) {
				flushTimer.Reset(max(time.Until(due), 0))
				flushAt = due
			}
		}
		select {
		case <-ctx.Done():
			return w.drain(context.WithoutCancel(ctx), queue)
		case <-flushTimer.C:
			flushAt = time.Time{}
			// A store since arming may have made this one early; the
			// top of the loop then arms the timer again.
			if w.pending != nil && !time.Now().Before(w.storeDue()) {
				if err := w.flush(wctx); err != nil {
					return err
				}
			}
		case <-beat.C:
			if time.Since(w.stored) < cfg.heartbeatInterval() {
				continue // a store on the session just showed it alive
			}
			// A check vouches for the session for one heartbeat interval:
			// a stream that polls less often (the unrouted message
			// stream, once a second) pings in between. It says nothing of
			// the connection, though: one the network swallows while its
			// backend lives keeps the lock and passes every check, and
			// only a ping, slowPings apart, sees it time out.
			slow := slowPings * cfg.heartbeatInterval()
			if lock.vouches(time.Now(), cfg.heartbeatInterval()) && (time.Since(w.stored) < slow || time.Since(pinged) < slow) {
				continue // a read just found the lock held by the session
			}
			if err := w.heartbeat(ctx); err != nil {
				return err
			}
			pinged = time.Now()
		case <-lock.lost:
			continue // the top of the loop gives the stream up
		case <-balance.C:
			if w.r.yieldExtra(ctx, w.member, name) {
				w.r.log.Info("relay: handing stream to another relay for balance", "stream", name)
				return w.drain(context.WithoutCancel(ctx), queue)
			}
		case <-head:
			f := queue[0]
			queue = queue[1:]
			if f.err != nil { // only errShutdown: the grace period ran out
				return w.drain(context.WithoutCancel(ctx), nil)
			}
			if err := w.complete(wctx, f); err != nil {
				return err
			}
		case p, ok := <-in:
			if lock.isLost() {
				// Read after the lock was found gone (or ready together
				// with lost): dropped; the top of the loop gives up.
				continue
			}
			if !ok {
				return w.drain(context.WithoutCancel(ctx), queue)
			}
			var changed *serverChangedError
			if errors.As(p.err, &changed) {
				// Nothing read since the last store is trusted: what is in
				// flight finishes (deferred above) but is not acknowledged.
				return p.err
			}
			if p.err != nil {
				w.r.log.Error("relay: stopping the stream", "stream", name, "err", p.err)
				return p.err
			}
			f := &inflight{p: p, done: make(chan struct{})}
			if len(p.events) == 0 {
				close(f.done)
			} else {
				w.r.eventsRead.Add(int64(len(p.events)))
				go func() {
					defer close(f.done)
					f.dead, f.err = w.deliver(wctx, p.events)
				}()
			}
			queue = append(queue, f)
		}
	}
}

// inflight is a page at the sink.
type inflight struct {
	p    page
	done chan struct{}
	dead []deadLetter
	err  error
}

// drain waits for the pages still at the sink, acknowledges them in order
// up to the first one shutdown cut short, and stores the position.
func (w *streamWriter) drain(ctx context.Context, queue []*inflight) error {
	for _, f := range queue {
		<-f.done
		if f.err != nil {
			break
		}
		if err := w.complete(ctx, f); err != nil {
			return err
		}
	}
	return w.flush(ctx)
}

// storeDue is when the pending position is due to be stored. A position
// moved only by empty pages is worth storing soon when events went by
// (retention waits for every stream to pass them); when no stream here
// read any, it moved past transactions without events, very likely the
// progress stores of this relay's other streams, each of which moves the
// others: stored once a second, an idle relay's streams would keep one
// another writing for good.
func (w *streamWriter) storeDue() time.Time {
	switch {
	case w.pendingAcked > 0:
		return w.stored.Add(w.r.cfg.StoreInterval)
	case w.r.eventsRead.Load() != w.readAtStore:
		return w.stored.Add(w.r.cfg.ProgressInterval)
	}
	return w.stored.Add(w.r.cfg.QuietProgressInterval)
}

// complete records a handled page's position, storing it when due.
func (w *streamWriter) complete(ctx context.Context, f *inflight) error {
	w.pending = &f.p.pos
	if len(f.p.events) == 0 {
		// An empty batch moves the position without acknowledging any
		// event; storing it can wait, re-reading nothing costs nothing.
		if !time.Now().Before(w.storeDue()) {
			return w.flush(ctx)
		}
		return nil
	}
	w.pendingAcked += len(f.p.events)
	w.pendingDead = append(w.pendingDead, f.dead...)
	if len(f.dead) > 0 || time.Since(w.stored) >= w.r.cfg.StoreInterval {
		return w.flush(ctx)
	}
	return nil
}

func (w *streamWriter) flush(ctx context.Context) error {
	if w.pending == nil {
		return nil
	}
	if err := w.store(ctx, *w.pending, w.pendingAcked, w.pendingDead); err != nil {
		return err
	}
	if w.pendingAcked > 0 {
		w.r.metrics.lastCycle.WithLabelValues(w.stream.Name).SetToCurrentTime()
	}
	w.pendingAcked, w.pendingDead = 0, nil
	return nil
}

func (w *streamWriter) store(ctx context.Context, pos position, acked int, dead []deadLetter) error {
	if err := storeProgress(ctx, w.conn, w.r.schema, w.r.cfg.Schema, w.stream.Name, pos, acked, dead); err != nil {
		w.r.metrics.progressErrs.WithLabelValues(w.stream.Name).Inc()
		w.r.log.Error("relay: cannot persist progress; giving up the stream to lead it again from the stored position", "stream", w.stream.Name, "err", err)
		return err
	}
	w.acked, w.pending, w.stored = pos, nil, time.Now()
	w.lock.noteStore(w.stored)
	w.readAtStore = w.r.eventsRead.Load()
	w.r.metrics.ackedEvents.WithLabelValues(w.stream.Name).Add(float64(acked))
	w.r.metrics.progressXID.WithLabelValues(w.stream.Name).Set(float64(pos.done.Xmax))
	for _, d := range dead {
		w.r.metrics.deadLetters.WithLabelValues(w.stream.Name, d.event.IndexName).Inc()
		w.r.metrics.events.WithLabelValues(w.stream.Name, d.event.IndexName, "deadlettered").Inc()
		w.r.log.Warn("relay: event dead-lettered", "stream", w.stream.Name, "event_id", d.event.ID,
			"index", d.event.IndexName, "source_id", d.event.SourceID, "version", d.event.Version, "reason", d.reason)
	}
	return nil
}

// sink is the stream's own sink, or the relay's.
func (w *streamWriter) sink() Sink {
	if w.stream.Sink != nil {
		return w.stream.Sink
	}
	return w.r.cfg.Sink
}
