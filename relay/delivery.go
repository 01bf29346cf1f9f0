package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
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
	// Handled but not yet stored: progress is coalesced so that a busy
	// stream updates its row a few times a second, not once per page (every
	// update leaves a row version that an open transaction anywhere in the
	// cluster keeps from being cleaned up).
	pendingAcked int
	pendingDead  []deadLetter

	lingerRate float64 // events per second seen by the last linger; the read loop's own
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

	rd := &reader{pool: cfg.Pool, schema: w.r.schema, stream: w.stream, maxDocs: cfg.MaxBatchDocs, maxBytes: cfg.MaxBatchBytes, pos: w.acked}
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	pages := make(chan page, cfg.Prefetch)
	go w.readLoop(readCtx, rd, pages)

	balance := time.NewTicker(cfg.LeaseInterval)
	defer balance.Stop()
	// Armed only while handled events wait to be stored: an idle stream
	// has nothing to flush and should not wake up to find that out.
	flushTimer := time.NewTimer(cfg.StoreInterval)
	flushTimer.Stop()
	defer flushTimer.Stop()
	flushArmed := false
	beat := time.NewTicker(cfg.heartbeatInterval())
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
		var head chan struct{}
		if len(queue) > 0 {
			head = queue[0].done
		}
		var in <-chan page
		if len(queue) < cfg.InFlight {
			in = pages
		}
		m.pagesInFlight.WithLabelValues(name).Set(float64(len(queue)))
		if w.pendingAcked > 0 && !flushArmed {
			flushTimer.Reset(max(cfg.StoreInterval-time.Since(w.stored), 0))
			flushArmed = true
		}
		select {
		case <-ctx.Done():
			return w.drain(context.WithoutCancel(ctx), queue)
		case <-flushTimer.C:
			flushArmed = false
			if w.pendingAcked > 0 {
				if err := w.flush(wctx); err != nil {
					return err
				}
			}
		case <-beat.C:
			if time.Since(w.stored) < cfg.heartbeatInterval() {
				continue // a store on the session just showed it alive
			}
			if err := w.heartbeat(ctx); err != nil {
				return err
			}
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
			if !ok {
				return w.drain(context.WithoutCancel(ctx), queue)
			}
			if p.err != nil {
				w.r.log.Error("relay: stopping the stream", "stream", name, "err", p.err)
				return p.err
			}
			f := &inflight{p: p, done: make(chan struct{})}
			if len(p.events) == 0 {
				close(f.done)
			} else {
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

// complete records a handled page's position, storing it when due.
func (w *streamWriter) complete(ctx context.Context, f *inflight) error {
	w.pending = &f.p.pos
	if len(f.p.events) == 0 {
		// An empty batch moves the position without acknowledging any
		// event; storing it can wait, re-reading nothing costs nothing.
		if time.Since(w.stored) >= w.r.cfg.ProgressInterval {
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

// deliver gets a terminal outcome for every event: applied, stale, or
// parked as a dead letter. Transient failures are retried with backoff up
// to MaxAttempts per event; a sink that is down as a whole is retried
// without limit (and loudly), so an outage never dead-letters the backlog.
func (w *streamWriter) deliver(ctx context.Context, events []outbox.Event) ([]deadLetter, error) {
	cfg := w.r.cfg
	m := w.r.metrics
	name := w.stream.Name
	pending := events
	attempts := make(map[int64]int) // by event id, only for retried events
	firsts := make(map[int64]time.Time)
	var dead []deadLetter
	sinkFailures, rounds := 0, 0
	sinkDown := false // the sink was unreachable, or a probe failed, in this outage
	paused := false   // the stream's pause reason is set (see Relay.Paused)
	for len(pending) > 0 {
		start := time.Now()
		outs, err := w.sink().Write(ctx, pending)
		m.writeSeconds.WithLabelValues(name).Observe(time.Since(start).Seconds())
		if err == nil && len(outs) != len(pending) {
			err = fmt.Errorf("sink returned %d outcomes for %d events", len(outs), len(pending))
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, errShutdown
			}
			m.sinkErrors.WithLabelValues(name).Inc()
			d := backoff(cfg.BackoffBase, cfg.BackoffMax, sinkFailures)
			sinkFailures++
			w.r.log.Error("relay: sink unavailable; retrying the batch", "stream", name, "events", len(pending), "failures", sinkFailures, "retry_in", d, "err", err)
			w.r.setPaused(name, err.Error())
			paused = true
			sinkDown = true // unreachable: the first probe that gets through ends the wait
			ok, recovered := w.awaitSink(ctx, d, &sinkDown)
			if !ok {
				return nil, errShutdown
			}
			if recovered {
				sinkFailures = 0
			}
			continue
		}
		now := time.Now()
		var next []outbox.Event
		outage := "" // a reason when the sink reported an outage
		// Counted per (index, outcome) and added once: label lookups per
		// event were a measurable share of the relay's CPU.
		counts := make(map[[2]string]int, 4)
		lag := m.lagSeconds.WithLabelValues(name)
		for i, o := range outs {
			e := pending[i]
			switch o.Status {
			case outbox.Applied, outbox.Stale:
				counts[[2]string{e.IndexName, o.Status.String()}]++
				lag.Observe(now.Sub(e.CreatedAt).Seconds())
			case outbox.Rejected:
				counts[[2]string{e.IndexName, "rejected"}]++
				dead = append(dead, deadLetter{event: e, kind: KindRejected, reason: o.Reason, attempts: attempts[e.ID] + 1, first: firstOr(firsts, e.ID, now), last: now})
			default: // Retry, or a sink that forgot to say
				reason := o.Reason
				if o.Status != outbox.Retry {
					reason = fmt.Sprintf("sink returned no valid outcome (%d): %s", o.Status, o.Reason)
				}
				counts[[2]string{e.IndexName, "retried"}]++
				if o.Status == outbox.Retry && o.Outage {
					outage = reason
					next = append(next, e)
					continue
				}
				attempts[e.ID]++
				if _, ok := firsts[e.ID]; !ok {
					firsts[e.ID] = now
				}
				if attempts[e.ID] >= cfg.MaxAttempts {
					dead = append(dead, deadLetter{event: e, kind: KindGaveUp, reason: fmt.Sprintf("gave up after %d attempts: %s", attempts[e.ID], reason),
						attempts: attempts[e.ID], first: firsts[e.ID], last: now})
					continue
				}
				next = append(next, e)
			}
		}
		for k, n := range counts {
			m.events.WithLabelValues(name, k[0], k[1]).Add(float64(n))
		}
		pending = next
		if outage != "" {
			m.sinkErrors.WithLabelValues(name).Inc()
			d := backoff(cfg.BackoffBase, cfg.BackoffMax, sinkFailures)
			sinkFailures++
			w.r.log.Error("relay: sink outage; retrying without charging the events", "stream", name, "events", len(pending), "failures", sinkFailures, "retry_in", d, "reason", outage)
			w.r.setPaused(name, outage)
			paused = true
			ok, recovered := w.awaitSink(ctx, d, &sinkDown)
			if !ok {
				return nil, errShutdown
			}
			if recovered {
				sinkFailures = 0
			}
			continue
		}
		if paused {
			w.r.setPaused(name, "")
			paused = false
		}
		sinkFailures = 0
		if len(pending) > 0 {
			d := backoff(cfg.BackoffBase, cfg.BackoffMax, rounds)
			rounds++
			if !sleep(ctx, d) {
				return nil, errShutdown
			}
		}
	}
	return dead, nil
}

func firstOr(m map[int64]time.Time, id int64, def time.Time) time.Time {
	if t, ok := m[id]; ok {
		return t
	}
	return def
}

// readLoop reads pages ahead of the writer. It polls tightly while events
// keep coming and backs off to MaxPollInterval when idle; read errors are
// retried with backoff (the writer simply waits).
func (w *streamWriter) readLoop(ctx context.Context, rd *reader, out chan<- page) {
	defer close(out)
	cfg := w.r.cfg
	wake := w.r.waker.subscribe()
	defer w.r.waker.unsubscribe(wake)
	var wait time.Duration
	failures := 0
	last := rd.pos
	backlog := false // the last page was full: a backlog is being read
	for {
		p, err := rd.next(ctx)
		var fatal *PositionError
		if errors.As(err, &fatal) {
			select {
			case out <- page{err: err}:
			case <-ctx.Done():
			}
			return
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.r.metrics.readErrors.WithLabelValues(w.stream.Name).Inc()
			d := backoff(cfg.BackoffBase, cfg.BackoffMax, failures)
			failures++
			w.r.log.Warn("relay: read failed; retrying", "stream", w.stream.Name, "retry_in", d, "err", err)
			if !sleep(ctx, d) {
				return
			}
			continue
		}
		failures = 0
		if len(p.events) == 0 {
			if !p.pos.equal(last) {
				last = p.pos
				select {
				case out <- p:
				case <-ctx.Done():
					return
				}
			}
			wait = min(max(wait*2, cfg.MinPollInterval), cfg.MaxPollInterval)
			if !sleepOrWake(ctx, wait, wake) {
				return
			}
			continue
		}
		wait = 0
		if !backlog {
			p = w.linger(ctx, rd, p)
		}
		backlog = p.pos.batch != nil
		last = p.pos
		select {
		case out <- p:
		case <-ctx.Done():
			return
		}
	}
}

// linger holds back a page that arrived at a low rate, up to Linger from
// its reading, reading what commits meanwhile into it, so that the sink
// gets fewer, larger writes (a bulk request costs Elasticsearch about as
// much for one document as for dozens). It stops as soon as the page holds
// LingerDocs events or fills up, and does not start on a full page: a
// backlog is never held back. On shutdown it returns what it has; the
// events are not acknowledged unless the sink gets them.
//
// It reads again when the rate seen in earlier lingers says LingerDocs
// should be there, not at every poll interval: each read is a query.
func (w *streamWriter) linger(ctx context.Context, rd *reader, p page) page {
	cfg := w.r.cfg
	if cfg.Linger <= 0 || p.pos.batch != nil || len(p.events) >= cfg.LingerDocs {
		return p
	}
	start := time.Now()
	deadline := start.Add(cfg.Linger)
	first := len(p.events)
	maxDocs, maxBytes := rd.maxDocs, rd.maxBytes
	defer func() { rd.maxDocs, rd.maxBytes = maxDocs, maxBytes }()
	rate := w.lingerRate // events per second; 0 when unknown
	for len(p.events) < cfg.LingerDocs && p.pos.batch == nil {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		wait := cfg.Linger / lingerPolls
		if rate > 0 {
			wait = time.Duration(float64(cfg.LingerDocs-len(p.events)) / rate * float64(time.Second))
		}
		if !sleep(ctx, min(max(wait, cfg.MinPollInterval), left)) {
			break
		}
		// The page as a whole stays within the page limits.
		rd.maxDocs, rd.maxBytes = maxDocs-len(p.events), maxBytes-p.bytes
		if rd.maxDocs <= 0 || rd.maxBytes <= 0 {
			break
		}
		q, err := rd.next(ctx)
		if err != nil {
			// A failed read leaves rd's position at the end of p, so p
			// goes on as it is and the read loop reads the rest again.
			if ctx.Err() == nil {
				w.r.metrics.readErrors.WithLabelValues(w.stream.Name).Inc()
				w.r.log.Warn("relay: read failed while lingering; handing on the page as read so far", "stream", w.stream.Name, "events", len(p.events), "err", err)
			}
			break
		}
		p.events = append(p.events, q.events...)
		p.bytes += q.bytes
		p.pos = q.pos
		if n := len(p.events) - first; n > 0 {
			rate = float64(n) / time.Since(start).Seconds()
		}
	}
	w.lingerRate = rate
	return p
}

// lingerPolls is how many times a linger reads the outbox at most while
// the rate is unknown.
const lingerPolls = 12

// backoff is exponential with "equal jitter": half fixed, half random, so
// retries spread out without collapsing to near zero.
func backoff(base, limit time.Duration, n int) time.Duration {
	d := base << min(n, 30)
	if d <= 0 || d > limit {
		d = limit
	}
	return d/2 + rand.N(d/2+1)
}

func jitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sink is the stream's own sink, or the relay's.
func (w *streamWriter) sink() Sink {
	if w.stream.Sink != nil {
		return w.stream.Sink
	}
	return w.r.cfg.Sink
}
