package scan

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/progress"
)

// Hit is one document seen by Each, with the coordinates a conditional
// write needs (_seq_no, _primary_term) and the version it holds.
type Hit struct {
	Index       string          `json:"_index"`
	ID          string          `json:"_id"`
	Version     int64           `json:"_version"`
	SeqNo       int64           `json:"_seq_no"`
	PrimaryTerm int64           `json:"_primary_term"`
	Source      json.RawMessage `json:"_source"`
}

// Options says what Each reads.
type Options struct {
	// Indices are scanned as given. Pass concrete indices, not a filtered
	// alias: the read alias hides tombstones, and repair must see them.
	Indices []string
	// SourceIncludes limits _source to these fields (dotted paths allowed);
	// nil reads whole sources. Repair asks only for the fields it ranks by,
	// so a page costs what its keys cost, not what its documents weigh.
	SourceIncludes []string
	// PageSize is the number of hits per request; 0 means 1000.
	PageSize int
	// KeepAlive is how long the point in time survives between pages; 0
	// means 2m.
	KeepAlive time.Duration
	// Progress, if set, is advanced by every hit.
	Progress *progress.Bar
	// Query, if set, selects the documents (a query DSL object); nil means
	// all of them.
	Query json.RawMessage
	// Refresh refreshes the indices before the point in time is opened:
	// a PIT sees only refreshed segments, and a repair planned right after
	// writes (or after a previous repair) must see them.
	Refresh bool
}

// Each streams every document of opts.Indices to fn, one page at a time, in
// a consistent view: a point in time (PIT) sorted by _shard_doc and paged
// with search_after. Memory is bounded by one page. Writes made during the
// scan are not seen; that is the point: the plan is computed on one
// snapshot, and the apply step detects later changes with _seq_no.
//
// PIT is a core (non-x-pack-licensed) API and is present in the integ-test
// distribution the tests use. OpenSearch has PIT under another path but no
// _shard_doc to page it by, so there the same view is a scroll sorted by
// _doc (scanScroll).
//
// fn must not keep hit.Source past its return: the buffer is reused.
func Each(ctx context.Context, es *elasticsearch.Client, opts Options, fn func(Hit) error) error {
	if len(opts.Indices) == 0 {
		return fmt.Errorf("indexer: scan: indices: none given")
	}
	size := opts.PageSize
	if size <= 0 {
		size = 1000
	}
	keep := opts.KeepAlive
	if keep <= 0 {
		keep = 2 * time.Minute
	}
	keepStr := fmt.Sprintf("%ds", int(keep.Seconds()))

	op := "scan " + strings.Join(opts.Indices, ",")
	if opts.Refresh {
		if err := Do(ctx, es, op+": refresh", esapi.IndicesRefreshRequest{Index: opts.Indices}, nil); err != nil {
			return err
		}
	}
	_, openSearch, err := indexer.Server(ctx, es)
	if err != nil {
		return err
	}
	if openSearch {
		return scanScroll(ctx, es, op, opts, size, keepStr, fn)
	}
	var opened struct {
		ID string `json:"id"`
	}
	if err := Do(ctx, es, op+": open point in time", esapi.OpenPointInTimeRequest{Index: opts.Indices, KeepAlive: keepStr}, &opened); err != nil {
		return err
	}
	pit := opened.ID
	defer func() {
		// Close with a fresh context: the caller's may be cancelled, and a
		// leaked PIT pins segments until it expires.
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		body, _ := json.Marshal(map[string]string{"id": pit})
		_ = Do(cctx, es, op+": close point in time", esapi.ClosePointInTimeRequest{Body: bytes.NewReader(body)}, nil)
	}()

	var after []json.RawMessage
	for {
		req := map[string]any{
			"size":                size,
			"pit":                 map[string]string{"id": pit, "keep_alive": keepStr},
			"sort":                []any{map[string]string{"_shard_doc": "asc"}},
			"version":             true,
			"seq_no_primary_term": true,
			"track_total_hits":    false,
		}
		if opts.Query != nil {
			req["query"] = opts.Query
		}
		if opts.SourceIncludes != nil {
			req["_source"] = map[string]any{"includes": opts.SourceIncludes}
		}
		if after != nil {
			req["search_after"] = after
		}
		body, err := json.Marshal(req)
		if err != nil {
			return err
		}
		var page struct {
			PitID string `json:"pit_id"`
			Hits  struct {
				Hits []struct {
					Hit
					Sort []json.RawMessage `json:"sort"`
				} `json:"hits"`
			} `json:"hits"`
		}
		if err := Do(ctx, es, op, esapi.SearchRequest{Body: bytes.NewReader(body)}, &page); err != nil {
			if IsStatus(err, 404) && strings.Contains(err.Error(), "search_phase_execution_exception") {
				return fmt.Errorf("indexer: %s: the point in time expired (it is kept alive %s past each page and while one waits on the sink); run again: %w", op, keepStr, err)
			}
			return err
		}
		if page.PitID != "" {
			pit = page.PitID
		}
		hits := page.Hits.Hits
		// fn may wait on a slow sink for longer than keep_alive: keep the
		// point in time alive meanwhile, or the next page finds it gone.
		stopKeeping := keepAlive(ctx, es, op, pit, keep, keepStr)
		for i := range hits {
			if err := fn(hits[i].Hit); err != nil {
				stopKeeping()
				return err
			}
		}
		stopKeeping()
		opts.Progress.Add(int64(len(hits)))
		if len(hits) < size {
			return nil
		}
		after = hits[len(hits)-1].Sort
	}
}

// scanScroll is Each on OpenSearch: a scroll holds the same consistent
// view of every shard, paged in _doc order.
func scanScroll(ctx context.Context, es *elasticsearch.Client, op string, opts Options, size int, keepStr string, fn func(Hit) error) error {
	req := map[string]any{
		"size":                size,
		"sort":                []string{"_doc"},
		"version":             true,
		"seq_no_primary_term": true,
	}
	if opts.Query != nil {
		req["query"] = opts.Query
	}
	if opts.SourceIncludes != nil {
		req["_source"] = map[string]any{"includes": opts.SourceIncludes}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	var page struct {
		ScrollID string `json:"_scroll_id"`
		Hits     struct {
			Hits []Hit `json:"hits"`
		} `json:"hits"`
	}
	keep, _ := time.ParseDuration(keepStr)
	err = Do(ctx, es, op, esapi.SearchRequest{Index: opts.Indices, Body: bytes.NewReader(body), Scroll: keep}, &page)
	defer func() {
		if page.ScrollID == "" {
			return
		}
		// A fresh context, as for a PIT: a leaked scroll pins segments.
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = Do(cctx, es, op+": clear scroll", esapi.ClearScrollRequest{ScrollID: []string{page.ScrollID}}, nil)
	}()
	for err == nil {
		hits := page.Hits.Hits
		for i := range hits {
			if err := fn(hits[i]); err != nil {
				return err
			}
		}
		opts.Progress.Add(int64(len(hits)))
		if len(hits) == 0 {
			return nil
		}
		id := page.ScrollID
		page.Hits.Hits = nil
		err = Do(ctx, es, op+": next page", esapi.ScrollRequest{ScrollID: id, Scroll: keep}, &page)
		if err != nil && strings.Contains(err.Error(), "search_context_missing_exception") {
			// Unlike a point in time, a scroll cannot be kept alive between
			// pages: say what happened instead of a bare 404.
			return fmt.Errorf("%w: the scroll expired: a page waited on the sink longer than the keep-alive (%s), and OpenSearch cannot extend a scroll between pages; run again with a longer keep-alive", err, keepStr)
		}
	}
	return err
}

// keepAlive extends the point in time pit every third of keep, with an
// empty search on it, until the returned stop is called.
func keepAlive(ctx context.Context, es *elasticsearch.Client, op, pit string, keep time.Duration, keepStr string) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(keep / 3)
		defer t.Stop()
		body, _ := json.Marshal(map[string]any{"size": 0, "track_total_hits": false, "pit": map[string]string{"id": pit, "keep_alive": keepStr}})
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				// A failure here shows on the next page's search.
				_ = Do(ctx, es, op+": keep the point in time alive", esapi.SearchRequest{Body: bytes.NewReader(body)}, nil)
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// Count returns how many documents the indices hold (tombstones
// included), for a progress bar's total.
func Count(ctx context.Context, es *elasticsearch.Client, indices []string) (int64, error) {
	var out struct {
		Count int64 `json:"count"`
	}
	if err := Do(ctx, es, "count "+strings.Join(indices, ","), esapi.CountRequest{Index: indices}, &out); err != nil {
		return 0, err
	}
	return out.Count, nil
}

// CountQuery returns how many documents of index match query.
func CountQuery(ctx context.Context, es *elasticsearch.Client, index string, query json.RawMessage) (int64, error) {
	var out struct {
		Count int64 `json:"count"`
	}
	body := `{"query":` + string(query) + `}`
	if err := Do(ctx, es, "count "+index, esapi.CountRequest{Index: []string{index}, Body: strings.NewReader(body)}, &out); err != nil {
		return 0, err
	}
	return out.Count, nil
}

// IsStatus reports whether err is an Elasticsearch answer with status.
func IsStatus(err error, status int) bool {
	var re *indexer.ResponseError
	return errors.As(err, &re) && re.Status == status
}

// Do performs req (see indexer.Perform) and decodes the 2xx body into out,
// if non-nil.
func Do(ctx context.Context, es *elasticsearch.Client, op string, req esapi.Request, out any) error {
	body, err := indexer.Perform(ctx, es, op, req)
	if err != nil || out == nil {
		return err
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("indexer: %s: decode response: %w", op, err)
	}
	return nil
}
