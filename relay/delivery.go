package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

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
