package relay

import (
	"context"
	"time"
)

// Prober is an optional interface of a Sink: a cheap check that the sink
// answers at all (for Elasticsearch, a cluster health request). While the
// sink is out, the relay probes it every probeInterval and retries the
// page as soon as a probe succeeds again, instead of waiting out a backoff
// that has grown to BackoffMax over the outage.
type Prober interface {
	Probe(ctx context.Context) error
}

const probeInterval = time.Second

// awaitSink waits up to d before a page the sink could not take is tried
// again. With a Prober it probes meanwhile and cuts the wait short once a
// probe succeeds while *down (the sink was unreachable, or a probe failed,
// in this outage): the outage is over, and the caller starts its backoff
// afresh. A sink that answers probes but refuses writes (overloaded, 429)
// gets the full wait. It returns false on shutdown.
func (w *streamWriter) awaitSink(ctx context.Context, d time.Duration, down *bool) (ok, recovered bool) {
	p, probes := w.r.cfg.Sink.(Prober)
	if !probes || d <= probeInterval {
		return sleep(ctx, d), false
	}
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return true, false
		}
		if !sleep(ctx, min(probeInterval, left)) {
			return false, false
		}
		pctx, cancel := context.WithTimeout(ctx, probeInterval)
		err := p.Probe(pctx)
		cancel()
		switch {
		case err != nil:
			*down = true
		case *down:
			*down = false
			w.r.log.Info("relay: sink answers again; retrying now", "stream", w.stream.Name)
			return true, true
		}
	}
}
