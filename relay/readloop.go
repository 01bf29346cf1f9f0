package relay

import (
	"context"
	"errors"
	"time"
)

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
	idle := cfg.MaxPollInterval
	if w.stream.MaxPollInterval > 0 {
		idle = w.stream.MaxPollInterval
	}
	for {
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
		if len(p.events) == 0 {
			if !p.pos.equal(last) {
				last = p.pos
				select {
				case out <- p:
				case <-ctx.Done():
					return
				}
			}
			wait = min(max(wait*2, cfg.MinPollInterval), idle)
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
