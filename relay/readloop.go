package relay

import (
	"context"
	"errors"
	"time"
)

// readLoop reads pages ahead of the writer. It polls tightly while events
// keep coming and backs off to MaxPollInterval when idle, and to
// QuietPollInterval once quiet; read errors are retried with backoff (the
// writer simply waits).
func (w *streamWriter) readLoop(ctx context.Context, rd *reader, out chan<- page) {
	defer close(out)
	cfg := w.r.cfg
	wake := w.r.waker.subscribe()
	defer w.r.waker.unsubscribe(wake)
	var wait time.Duration
	failures := 0
	last := rd.pos
	backlog := false // the last page was full: a backlog is being read
	idle, quiet := cfg.idleWait(w.stream), cfg.quietWait(w.stream)
	lastEvents := time.Now() // of the last page with events, or the start
	// trickle is when the last page of a trickle was handed on, zero
	// otherwise. A read right after it would find an event or two and
	// linger on them; the stream waits instead until the rate says
	// LingerDocs are there, and reads once. At 500 events/s that took the
	// reads from about three per page to one, and each costs a round trip
	// and its wake-ups on both sides, about 0.7 ms of CPU here. The wait
	// is a linger's: a NOTIFY wake-up does not cut it short (it stays
	// buffered and wakes the next idle wait).
	var trickle time.Time
	for {
		began, counted := time.Now(), false
		if !trickle.IsZero() {
			began, counted = trickle, true
			if !sleep(ctx, time.Until(trickle.Add(w.fillTime(rd.maxDocs)))) {
				return
			}
			trickle = time.Time{}
		}
		p, err := rd.next(ctx)
		var fatal *PositionError
		var changed *serverChangedError
		if errors.As(err, &fatal) || errors.As(err, &changed) {
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
		if cfg.afterPoll != nil {
			cfg.afterPoll(len(p.events))
		}
		if len(p.events) == 0 {
			if !p.pos.equal(last) {
				last = p.pos
				select {
				case out <- p:
				case <-ctx.Done():
					return
				}
			}
			wait = nextWait(wait, cfg.MinPollInterval, idle, quiet, time.Since(lastEvents) >= cfg.QuietAfter)
			if !sleepOrWake(ctx, wait, wake) {
				return
			}
			continue
		}
		wait = 0
		lastEvents = time.Now()
		trickling := false
		if !backlog {
			p, trickling = w.linger(ctx, rd, p, began, counted)
		}
		backlog = p.pos.batch != nil
		if backlog {
			w.lingerRate = 0 // a backlog says nothing about the next trickle's rate
		}
		last = p.pos
		// Taken before the hand-over: a writer that took long to accept
		// the page (a paused sink) leaves no wait before the next read.
		handed := time.Now()
		select {
		case out <- p:
		case <-ctx.Done():
			return
		}
		if trickling {
			trickle = handed
		}
	}
}

// idleWait is stream s's longest wait between polls when idle, quietWait
// once it is quiet (Config.QuietAfter).
func (c *Config) idleWait(s Stream) time.Duration {
	if s.MaxPollInterval > 0 {
		return s.MaxPollInterval
	}
	return c.MaxPollInterval
}

func (c *Config) quietWait(s Stream) time.Duration {
	return max(c.idleWait(s), c.QuietPollInterval)
}

// nextWait is the wait after an empty poll that followed a wait of prev:
// doubling from min up to idle, or up to quiet once the stream is quiet
// (it read no event for Config.QuietAfter).
func nextWait(prev, first, idle, quiet time.Duration, quieted bool) time.Duration {
	limit := idle
	if quieted {
		limit = quiet
	}
	return min(max(prev*2, first), limit)
}

// fillTime is how long LingerDocs events, or a page of maxDocs if that
// is fewer, take to commit at the rate the last linger saw, at most Linger.
func (w *streamWriter) fillTime(maxDocs int) time.Duration {
	cfg := w.r.cfg
	if w.lingerRate <= 0 {
		return 0
	}
	return min(cfg.Linger, time.Duration(float64(min(cfg.LingerDocs, maxDocs))/w.lingerRate*float64(time.Second)))
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
//
// The linger runs Linger from start: the read loop's wait for a trickle
// counts as part of it, so no event waits longer than Linger in all.
// counted says that p's events all committed since start and measure the
// rate; otherwise only what the linger reads does. trickling reports a
// page of a trickle, with a rate measured: not a full page, not one cut
// short by a failed read, not one that reached LingerDocs at once after
// an idle wait (its rate is unknown).
func (w *streamWriter) linger(ctx context.Context, rd *reader, p page, start time.Time, counted bool) (_ page, trickling bool) {
	cfg := w.r.cfg
	if cfg.Linger <= 0 || w.stream.NoLinger || p.pos.batch != nil {
		return p, false
	}
	first := len(p.events)
	if counted {
		first = 0
	}
	if len(p.events) >= cfg.LingerDocs {
		if !counted {
			return p, false
		}
		w.lingerRate = float64(len(p.events)) / max(time.Since(start).Seconds(), 1e-6)
		return p, true
	}
	deadline := start.Add(cfg.Linger)
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
			// goes on as it is and the read loop reads the rest again,
			// at once.
			if ctx.Err() == nil {
				w.r.metrics.readErrors.WithLabelValues(w.stream.Name).Inc()
				w.r.log.Warn("relay: read failed while lingering; handing on the page as read so far", "stream", w.stream.Name, "events", len(p.events), "err", err)
			}
			w.lingerRate = rate
			return p, false
		}
		p.events = append(p.events, q.events...)
		p.bytes += q.bytes
		p.pos = q.pos
		if n := len(p.events) - first; n > 0 {
			rate = float64(n) / time.Since(start).Seconds()
		}
	}
	w.lingerRate = rate
	return p, p.pos.batch == nil && rate > 0
}

// lingerPolls is how many times a linger reads the outbox at most while
// the rate is unknown.
const lingerPolls = 12
