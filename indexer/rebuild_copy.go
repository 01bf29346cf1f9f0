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
)

// copyDoc is one document written to the new index at its own version.
type copyDoc struct {
	id      string
	version int64
	source  []byte
}

// copyWriter sends documents to the new index in bulk requests, Workers at
// once. Every write is external_gte at the document's version: the same
// version again (a copy repeated after a restart, or the source's row for
// what the index holds) overwrites, an older one is a conflict and loses.
type copyWriter struct {
	r       *rebuilder
	counted bool // the copy phase: counted in the rebuilds table and the progress bar
	ctx     context.Context
	cancel  context.CancelFunc
	batch   []copyDoc
	queue   chan []copyDoc
	wg      sync.WaitGroup

	mu     sync.Mutex
	copied int64
	err    error
}

func (r *rebuilder) newWriter(ctx context.Context, counted bool) *copyWriter {
	ctx, cancel := context.WithCancel(ctx)
	w := &copyWriter{r: r, counted: counted, ctx: ctx, cancel: cancel, queue: make(chan []copyDoc, r.o.Workers)}
	for range r.o.Workers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for docs := range w.queue {
				if w.ctx.Err() != nil {
					continue
				}
				n, err := w.send(docs)
				if err == nil && w.counted {
					err = w.r.st.addCopied(w.ctx, n)
				}
				w.mu.Lock()
				w.copied += n
				if err != nil && w.err == nil {
					w.err = err
					w.cancel()
				}
				w.mu.Unlock()
				if w.counted {
					w.r.o.Progress.Add(int64(len(docs)))
				}
			}
		}()
	}
	return w
}

// add queues d; it returns the first error a worker met.
func (w *copyWriter) add(d copyDoc) error {
	w.batch = append(w.batch, d)
	if len(w.batch) < w.r.o.Batch {
		return nil
	}
	return w.flush()
}

func (w *copyWriter) flush() error {
	if len(w.batch) > 0 {
		select {
		case w.queue <- w.batch:
		case <-w.ctx.Done():
		}
		w.batch = nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	return w.ctx.Err()
}

// close sends what is left, waits for the workers and returns how many
// documents the new index took (applied or already newer).
func (w *copyWriter) close() (int64, error) {
	err := w.flush()
	close(w.queue)
	w.wg.Wait()
	w.cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		err = w.err
	}
	return w.copied, err
}

// abandon stops the workers after err.
func (w *copyWriter) abandon(err error) error {
	w.cancel()
	close(w.queue)
	w.wg.Wait()
	return err
}

// reject records a document the new index will never take.
func (w *copyWriter) reject(id, reason string) {
	err := w.r.st.addRejected(w.ctx, id, reason)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil && w.err == nil {
		w.err = err
	}
	cur := w.r.cur
	cur.Rejected++
	if len(cur.Samples) < 20 {
		cur.Samples = append(cur.Samples, BackfillReject{ID: id, Reason: reason})
	}
}

// send writes docs, retrying what Elasticsearch answered 429, 408 or 5xx
// (up to 10 times per document; a whole request, or an unreachable
// cluster, up to OutageTimeout), halving a request refused as a whole with 400 or 413
// until the bad document stands alone, and recording refused documents.
func (w *copyWriter) send(docs []copyDoc) (int64, error) {
	var done int64
	outageSince := time.Time{}
	for attempt, delay := 1, 100*time.Millisecond; len(docs) > 0; attempt++ {
		n, again, err := w.bulk(docs, attempt >= 10)
		done += n
		switch {
		case err != nil && IsUnavailable(err):
			if outageSince.IsZero() {
				outageSince = time.Now()
			}
			if time.Since(outageSince) > w.r.o.OutageTimeout {
				return done, fmt.Errorf("indexer: rebuild: Elasticsearch has been unavailable for %s: %w", w.r.o.OutageTimeout, err)
			}
		case err != nil:
			return done, err
		default:
			outageSince = time.Time{}
			docs = again
		}
		if len(docs) == 0 {
			break
		}
		select {
		case <-time.After(delay):
		case <-w.ctx.Done():
			return done, w.ctx.Err()
		}
		delay = min(2*delay, 5*time.Second)
	}
	return done, nil
}

// bulk runs one request; it returns how many documents were taken and
// those to retry. last turns retriable item failures into rejections.
func (w *copyWriter) bulk(docs []copyDoc, last bool) (int64, []copyDoc, error) {
	bp := getBody()
	defer putBody(bp)
	b := (*bp)[:0]
	for _, d := range docs {
		b = append(b, `{"index":{"_index":`...)
		b = appendString(b, w.r.cur.New)
		b = append(b, `,"_id":`...)
		b = appendString(b, d.id)
		b = append(b, `,"version":`...)
		b = fmt.Appendf(b, "%d", d.version)
		b = append(b, `,"version_type":"external_gte"}}`+"\n"...)
		b = append(b, d.source...)
		b = append(b, '\n')
	}
	*bp = b
	req := esapi.BulkRequest{Body: bytes.NewReader(b), FilterPath: bulkFilterPath, IncludeSourceOnError: &ptrFalse}
	res, err := req.Do(w.ctx, w.r.o.ES)
	if err != nil {
		if w.ctx.Err() != nil {
			return 0, nil, w.ctx.Err()
		}
		return 0, nil, &UnavailableError{Err: err}
	}
	rb := getBody()
	defer putBody(rb)
	body, err := readAll(res, rb)
	switch {
	case err != nil:
		return 0, nil, &UnavailableError{Err: err}
	case res.StatusCode == http.StatusOK && allSucceeded(body):
		return int64(len(docs)), nil, nil
	case res.StatusCode == http.StatusOK:
		var r bulkResponse
		if err := json.Unmarshal(body, &r); err != nil || len(r.Items) != len(docs) {
			return 0, docs, nil
		}
		var n int64
		var again []copyDoc
		for i := range r.Items {
			c, reason := classify(&r.Items[i].Index)
			switch {
			case c == classApplied, c == classConflict:
				n++
			case c == classRetry && !last:
				again = append(again, docs[i])
			case r.Items[i].Index.Status == 404:
				return n, nil, fmt.Errorf("indexer: rebuild: the new index %s vanished: %s", w.r.cur.New, reason)
			default:
				w.reject(docs[i].id, reason)
			}
		}
		return n, again, nil
	case (res.StatusCode == http.StatusBadRequest || res.StatusCode == http.StatusRequestEntityTooLarge) && len(docs) > 1:
		h := len(docs) / 2
		n1, a1, err := w.bulk(docs[:h], last)
		if err != nil {
			return n1, nil, err
		}
		n2, a2, err := w.bulk(docs[h:], last)
		return n1 + n2, append(a1, a2...), err
	case res.StatusCode == http.StatusBadRequest || res.StatusCode == http.StatusRequestEntityTooLarge:
		w.reject(docs[0].id, responseError("bulk", res.StatusCode, body).Error())
		return 0, nil, nil
	case res.StatusCode == 429 || res.StatusCode == 408 || res.StatusCode >= 500:
		// The cluster's state, not the documents': waited out like an
		// unreachable cluster.
		return 0, nil, &UnavailableError{Err: responseError("rebuild bulk", res.StatusCode, body)}
	}
	return 0, nil, responseError("rebuild bulk", res.StatusCode, body)
}
