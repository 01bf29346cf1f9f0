package rebuild

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/backfill"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
)

// keywordSpec is the layout before the rebuild: title is a keyword, so a
// search for one word of it finds nothing; textMappings makes it text.
const (
	keywordSpec  = `{"mappings":{"properties":{"title":{"type":"keyword"}}}}`
	textMappings = `{"properties":{"title":{"type":"text"}}}`
)

// setupRebuild is a tooltest.Source whose index holds every row of the
// table (title a keyword); every concrete index of the name, the rebuilt
// ones too, is deleted when the test ends.
func setupRebuild(t *testing.T, rows int) *tooltest.Source {
	return setupRebuildSpec(t, rows, keywordSpec)
}

// setupRebuildSpec is setupRebuild with the index made from spec.
func setupRebuildSpec(t *testing.T, rows int, spec string) *tooltest.Source {
	t.Helper()
	e := tooltest.NewSource(t, rows)
	sink := tooltest.NewSink(t, indexer.Options{Client: e.ES, IndexSpec: []byte(spec)})
	if _, err := backfill.Run(context.Background(), backfill.Options{Pool: e.Pool, Schema: e.Schema, Sink: sink, Index: e.Name, SourceSQL: e.SQL(), Batch: 2000}); err != nil {
		t.Fatal(err)
	}
	estest.Refresh(t, e.ES, e.Name)
	return e
}

// rebuildOpts rebuilds e's index with textMappings.
func rebuildOpts(e *tooltest.Source) Options {
	return Options{Pool: e.Pool, Schema: e.Schema, ES: e.ES, Index: e.Name, Mappings: []byte(textMappings), Grace: 500 * time.Millisecond}
}

// aliasTarget returns the concrete indices behind alias.
func aliasTarget(t *testing.T, es *elasticsearch.Client, alias string) string {
	t.Helper()
	st, b := estest.Call(t, es, "GET", "/_alias/"+alias, "")
	if st != 200 {
		t.Fatalf("get alias %s: %d %s", alias, st, b)
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	var names []string
	for k := range m {
		names = append(names, k)
	}
	return strings.Join(names, ",")
}

// phase reads the phase and copied count of e's rebuild.
func phase(t *testing.T, e *tooltest.Source) (phase string, copied int64) {
	t.Helper()
	err := e.Pool.QueryRow(context.Background(), `SELECT phase, copied FROM "`+e.Schema+`".rebuilds WHERE index_name = $1`, e.Name).Scan(&phase, &copied)
	if err != nil {
		t.Fatal(err)
	}
	return phase, copied
}

// cancelWhen cancels the returned context once cond holds.
func cancelWhen(cond func() bool) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for ctx.Err() == nil {
			if cond() {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return ctx
}

// cancelOn is a log handler that cancels a run when it logs msg: a kill
// at a precise point of a rebuild.
type cancelOn struct {
	msg    string
	cancel func()
}

func (h cancelOn) Enabled(context.Context, slog.Level) bool { return true }
func (h cancelOn) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h cancelOn) WithGroup(string) slog.Handler            { return h }
func (h cancelOn) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.cancel()
	}
	return nil
}

// searcher polls N with random searches, as an application would, and
// counts failures and tombstones seen.
type searcher struct {
	done                          chan struct{}
	wg                            sync.WaitGroup
	searches, failures, tombstone atomic.Int64
	firstFailure                  atomic.Value
}

func startSearcher(t *testing.T, es *elasticsearch.Client, name string) *searcher {
	s := &searcher{done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case <-s.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			res, err := esapi.SearchRequest{Index: []string{name}, Body: strings.NewReader(`{"size":50,"query":{"function_score":{"random_score":{}}}}`)}.Do(context.Background(), es)
			s.searches.Add(1)
			if err != nil {
				s.failures.Add(1)
				s.firstFailure.CompareAndSwap(nil, err.Error())
				continue
			}
			var page struct {
				Hits struct {
					Hits []struct {
						Source json.RawMessage `json:"_source"`
					} `json:"hits"`
				} `json:"hits"`
			}
			err = json.NewDecoder(res.Body).Decode(&page)
			res.Body.Close()
			if res.StatusCode != 200 || err != nil || len(page.Hits.Hits) == 0 {
				s.failures.Add(1)
				s.firstFailure.CompareAndSwap(nil, fmt.Sprintf("HTTP %d, %d hits, %v", res.StatusCode, len(page.Hits.Hits), err))
				continue
			}
			for _, h := range page.Hits.Hits {
				if estest.IsTombstone(h.Source) {
					s.tombstone.Add(1)
				}
			}
		}
	}()
	return s
}

func (s *searcher) stop(t *testing.T) {
	close(s.done)
	s.wg.Wait()
	t.Logf("searcher: %d searches on the name, %d failed (first: %v), %d tombstones seen", s.searches.Load(), s.failures.Load(), s.firstFailure.Load(), s.tombstone.Load())
	if s.failures.Load() > 0 || s.tombstone.Load() > 0 || s.searches.Load() < 10 {
		t.Errorf("searches on the name: %d failed, %d tombstones seen, %d searches", s.failures.Load(), s.tombstone.Load(), s.searches.Load())
	}
}

// rebuildDocs is the size of the proof run: OUTBOXD_REBUILD_DOCS=200000
// for the full-size run by hand, 20,000 by default so that the race
// detector stays within a few minutes.
func rebuildDocs(t *testing.T) int {
	if v := os.Getenv("OUTBOXD_REBUILD_DOCS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1000 {
			t.Fatalf("OUTBOXD_REBUILD_DOCS=%q: want a number >= 1000", v)
		}
		return n
	}
	return 20_000
}

// countMatch counts the documents of name whose title matches word.
func countMatch(t *testing.T, es *elasticsearch.Client, name, word string) int64 {
	t.Helper()
	st, b := estest.Call(t, es, "POST", "/"+name+"/_count", `{"query":{"match":{"title":"`+word+`"}}}`)
	var out struct {
		Count int64 `json:"count"`
	}
	if st != 200 || json.Unmarshal(b, &out) != nil {
		t.Fatalf("count: %d %s", st, b)
	}
	return out.Count
}

// multiOnLog runs the function of a logged message, by message.
type multiOnLog map[string]func()

func (h multiOnLog) Enabled(context.Context, slog.Level) bool { return true }
func (h multiOnLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h multiOnLog) WithGroup(string) slog.Handler            { return h }
func (h multiOnLog) Handle(_ context.Context, r slog.Record) error {
	if f := h[r.Message]; f != nil {
		f()
	}
	return nil
}

// onLog is a log handler that runs f (once) when a run logs msg.
type onLog struct {
	msg  string
	once *sync.Once
	f    func()
}

func (h onLog) Enabled(context.Context, slog.Level) bool { return true }
func (h onLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h onLog) WithGroup(string) slog.Handler            { return h }
func (h onLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(h.f)
	}
	return nil
}
