package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/outbox"
)

// sendAll splits items into bulk requests bounded by count and bytes and
// runs up to s.workers of them at once.
func (s *Sink) sendAll(ctx context.Context, w *write, items []int, vt versionType) {
	// Spread a page over the workers (down to 100 events a request) so a
	// relay page smaller than workers*MaxBatchDocs still keeps every
	// worker busy.
	perChunk := min(s.maxDocs, max(100, (len(items)+s.workers-1)/s.workers))
	var chunks [][]int
	start, size := 0, 0
	for i, p := range items {
		n := approxSize(&w.events[p])
		if i > start && (i-start >= perChunk || size+n > s.maxBytes) {
			chunks = append(chunks, items[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(items) {
		chunks = append(chunks, items[start:])
	}
	if len(chunks) == 1 {
		s.send(ctx, w, chunks[0], vt)
		return
	}
	next := make(chan []int)
	var wg sync.WaitGroup
	for range min(s.workers, len(chunks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range next {
				s.send(ctx, w, c, vt)
			}
		}()
	}
	for _, c := range chunks {
		next <- c
	}
	close(next)
	wg.Wait()
}

func approxSize(e *outbox.Event) int {
	return 110 + 2*len(e.IndexName) + len(e.SourceID) + len(e.Document)
}

var (
	ptrTrue  = true
	ptrFalse = false
)

// send runs one bulk request and settles the outcome of each of its items.
func (s *Sink) send(ctx context.Context, w *write, items []int, vt versionType) {
	bp := getBody()
	defer putBody(bp)
	b := (*bp)[:0]
	for _, p := range items {
		e := &w.events[p]
		b = appendAction(b, e.IndexName, e.SourceID, e.Version, vt)
		if e.Op == outbox.OpDelete {
			b = appendTombstone(b, w.deletedAt)
		} else {
			b = append(b, oneLine(e.Document)...)
		}
		b = append(b, '\n')
	}
	*bp = b
	if len(b) > s.maxBytes && len(items) > 1 {
		// sendAll's estimate fell short (escaped ids, tombstones): the cap
		// is a promise to proxies and http.max_content_length, keep it.
		h := len(items) / 2
		s.send(ctx, w, items[:h], vt)
		s.send(ctx, w, items[h:], vt)
		return
	}

	started := time.Now()
	req := esapi.BulkRequest{
		Body:         bytes.NewReader(b),
		FilterPath:   bulkFilterPath,
		RequireAlias: &ptrTrue, // never auto-create a concrete index named like the alias
	}
	if w.sourceOnError {
		// Documents may hold personal data; keep them out of reasons and
		// logs. Servers before 8.18 refuse the parameter (and do not add
		// the source to errors).
		req.IncludeSourceOnError = &ptrFalse
	}
	res, err := req.Do(ctx, s.es)
	if err != nil {
		s.observe("unreachable", started)
		s.failed(ctx, w, items, vt, requestFailure{err: fmt.Errorf("bulk request: %w", err)})
		return
	}
	rb := getBody()
	defer putBody(rb)
	body, err := readAll(res, rb)
	switch {
	case err != nil:
		s.observe("unreachable", started)
		s.failed(ctx, w, items, vt, requestFailure{err: fmt.Errorf("bulk response: %w", err)})
	case res.StatusCode == http.StatusOK:
		w.answered()
		if allSucceeded(body) {
			s.observe("ok", started)
			s.settleAll(w, items, outbox.Outcome{Status: outbox.Applied})
			return
		}
		s.observe("item_errors", started)
		s.settleItems(w, items, body)
	default:
		s.observe("http_error", started)
		s.failed(ctx, w, items, vt, requestFailure{status: res.StatusCode, err: responseError("bulk", res.StatusCode, body)})
	}
}

func (s *Sink) settleAll(w *write, items []int, o outbox.Outcome) {
	for _, p := range items {
		w.out[p] = o
	}
}

func (s *Sink) settleItems(w *write, items []int, body []byte) {
	var r bulkResponse
	if err := json.Unmarshal(body, &r); err != nil || len(r.Items) != len(items) {
		reason := fmt.Sprintf("bulk response: expected %d items, could not read them", len(items))
		if err != nil {
			reason += ": " + err.Error()
		}
		s.settleAll(w, items, outbox.Outcome{Status: outbox.Retry, Reason: reason})
		return
	}
	for i, p := range items {
		c, reason := classify(&r.Items[i].Index)
		switch c {
		case classConflict:
			w.conflict(p, reason)
			continue
		case classMissingAlias:
			w.mu.Lock()
			if w.missing == nil {
				w.missing = make(map[string]bool)
			}
			w.missing[w.events[p].IndexName] = true
			w.mu.Unlock()
		}
		w.out[p] = outcomeOf(c, reason)
	}
}

func (s *Sink) observe(result string, started time.Time) {
	s.latency.WithLabelValues(result).Observe(time.Since(started).Seconds())
}
