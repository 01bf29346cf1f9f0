package indexer

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"regexp"
	"strconv"

	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/outbox"
)

// A bulk request that fails as a whole (an HTTP error, a timeout, a reset
// connection) says nothing by itself about whose fault it is: a cluster
// that is down or overloaded, a wrong configuration, or one payload the
// cluster, or a proxy in front of it, will never take (a document over the
// indexing-pressure limit answered 429, a body a proxy answers 403 or 502,
// a request that always times out). The sink tells them apart with a
// probe: a one-item bulk request of its own, with the same parameters, that
// writes nothing. When the probe fails too, the cluster or the
// configuration is at fault and no event is charged; when it succeeds, the
// failed request is halved until the event that fails alone is found, and
// that event is charged: it is retried within its attempt limit and then
// dead-lettered with the reason, so one event never stalls its stream.

// requestFailure is a bulk request's failure as a whole.
type requestFailure struct {
	status int   // HTTP status; 0 for a transport error
	err    error // *ResponseError or the transport's error
}

// probeResult is the outcome of the Write's probe; err nil means the
// cluster answered it.
type probeResult struct {
	done bool
	err  error
	fail requestFailure
}

// failed settles items after their bulk request failed as a whole.
func (s *Sink) failed(ctx context.Context, w *write, items []int, vt versionType, f requestFailure) {
	if ctx.Err() != nil {
		s.settleAll(w, items, outbox.Outcome{Status: outbox.Retry, Reason: f.err.Error(), Outage: true})
		return
	}
	// The verdict on one event rests on a probe sent right after its own
	// failure; halving a larger request can go on a probe of this Write.
	if p := s.probe(ctx, w, w.events[items[0]].IndexName, len(items) == 1); p.err != nil {
		s.sinkFault(w, items, p.fail)
		return
	}
	w.answered()
	if len(items) > 1 {
		h := len(items) / 2
		s.send(ctx, w, items[:h], vt)
		s.send(ctx, w, items[h:], vt)
		return
	}
	// This event fails alone where a tiny request succeeds: its own failure.
	reason := f.err.Error()
	if f.status == http.StatusBadRequest || f.status == http.StatusRequestEntityTooLarge ||
		f.status == http.StatusTooManyRequests && overPressureLimit(reason) {
		s.settleAll(w, items, outbox.Outcome{Status: outbox.Rejected, Reason: reason})
		return
	}
	s.settleAll(w, items, outbox.Outcome{Status: outbox.Retry, Reason: reason + " (a request without this event succeeds)"})
}

// coordinatingBytes finds the sizes in the indexing-pressure rejection:
// "coordinating_operation_bytes=N, max_coordinating_bytes=M" from
// Elasticsearch, "..., max_coordinating_and_primary_bytes=M" from
// OpenSearch.
var coordinatingBytes = regexp.MustCompile(`coordinating_operation_bytes=(\d+), max_coordinating(?:_and_primary)?_bytes=(\d+)`)

// overPressureLimit reports whether a 429 says the request alone is larger
// than the node's indexing-pressure limit: retrying cannot help, however
// idle the node gets, so its one event is rejected at once instead of
// being retried through its attempts.
func overPressureLimit(reason string) bool {
	m := coordinatingBytes.FindStringSubmatch(reason)
	if m == nil {
		return false
	}
	op, err1 := strconv.ParseInt(m[1], 10, 64)
	limit, err2 := strconv.ParseInt(m[2], 10, 64)
	return err1 == nil && err2 == nil && op > limit
}

// sinkFault settles items when even the probe failed.
func (s *Sink) sinkFault(w *write, items []int, f requestFailure) {
	o := outbox.Outcome{Status: outbox.Retry, Reason: f.err.Error(), Outage: true}
	switch {
	case f.status == 0:
		w.unreachable(f.err)
	case f.status == 408 || f.status == 429 || f.status >= 500:
		// Overloaded, recovering, no master: the cluster's state.
		w.answered()
	default:
		// 400 (a parameter this server refuses), 401, 403, 404, 413 for a
		// one-item request: the sink's configuration. Never dead-letter a
		// backlog for it.
		w.answered()
		w.mu.Lock()
		w.refused = f.err
		w.mu.Unlock()
	}
	s.settleAll(w, items, o)
}

// probe sends a bulk request with one update of a document with an empty
// partial document: it changes nothing (a missing document is an
// item-level 404, an existing one a no-op), but it takes the same path
// through proxies and the cluster as the events' requests. A failure holds
// for the rest of the Write; a success is reused unless fresh.
func (s *Sink) probe(ctx context.Context, w *write, index string, fresh bool) probeResult {
	w.probeMu.Lock()
	defer w.probeMu.Unlock()
	if w.probed.done && (!fresh || w.probed.err != nil) {
		return w.probed
	}
	body := appendString([]byte(`{"update":{"_index":`), WriteAlias(index))
	body = append(body, `,"_id":"outboxd-probe"}}`+"\n"+`{"doc":{}}`+"\n"...)
	req := esapi.BulkRequest{Body: bytes.NewReader(body), FilterPath: []string{"errors"}, RequireAlias: &ptrTrue}
	if w.sourceOnError {
		req.IncludeSourceOnError = &ptrFalse
	}
	_, err := perform(ctx, s.es, "bulk", req)
	p := probeResult{done: true, err: err}
	if err != nil {
		p.fail = requestFailure{err: err}
		var re *ResponseError
		if errors.As(err, &re) {
			p.fail.status = re.Status
		}
		s.logger.Warn("indexer: a one-item probe failed too; the cluster or the configuration is at fault, not the events", "error", err.Error())
	}
	if ctx.Err() == nil {
		w.probed = p
	}
	return p
}
