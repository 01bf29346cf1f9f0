package rebuild

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/source"
)

// copyWriter sends documents to the new index in bulk requests, Workers at
// once. Every write is external_gte at the document's version: the same
// version again (a copy repeated after a restart, or the source's row for
// what the index holds) overwrites, an older one is a conflict and loses.
type copyWriter struct {
	r       *runner
	counted bool // the copy phase: counted in the rebuilds table and the progress bar
	ctx     context.Context
	cancel  context.CancelFunc
	batch   []indexer.CopyItem
	queue   chan []indexer.CopyItem
	wg      sync.WaitGroup

	mu     sync.Mutex
	copied int64
	err    error
}

func (r *runner) newWriter(ctx context.Context, counted bool) *copyWriter {
	ctx, cancel := context.WithCancel(ctx)
	w := &copyWriter{r: r, counted: counted, ctx: ctx, cancel: cancel, queue: make(chan []indexer.CopyItem, r.o.Workers)}
	for range r.o.Workers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for docs := range w.queue {
				if w.ctx.Err() != nil {
					continue
				}
				// A run that lost its lock writes nothing more.
				err := w.r.st.check(w.ctx)
				var n int64
				if err == nil {
					n, err = w.send(docs)
				}
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
func (w *copyWriter) add(d indexer.CopyItem) error {
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
		cur.Samples = append(cur.Samples, source.Reject{ID: id, Reason: reason})
	}
}

// send writes docs, retrying what Elasticsearch answered 429, 408 or 5xx
// (up to 10 times per document; a whole request, or an unreachable
// cluster, up to OutageTimeout), halving a request refused as a whole with 400 or 413
// until the bad document stands alone, and recording refused documents.
func (w *copyWriter) send(docs []indexer.CopyItem) (int64, error) {
	var done int64
	outageSince := time.Time{}
	for attempt, delay := 1, 100*time.Millisecond; len(docs) > 0; attempt++ {
		n, again, err := w.bulk(docs, attempt >= 10)
		done += n
		switch {
		case err != nil && indexer.IsUnavailable(err):
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

// bulk runs one request through indexer.CopyVersioned; it returns how
// many documents were taken and those to retry. last turns retriable item
// failures into rejections.
func (w *copyWriter) bulk(docs []indexer.CopyItem, last bool) (int64, []indexer.CopyItem, error) {
	n, again, rejected, err := indexer.CopyVersioned(w.ctx, w.r.o.ES, w.r.cur.New, docs, last)
	for _, rj := range rejected {
		w.reject(rj.ID, rj.Reason)
	}
	return n, again, err
}
