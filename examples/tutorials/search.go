package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// SearchResult is GET /api/search's answer.
type SearchResult struct {
	Query   string     `json:"query"`
	Total   int        `json:"total"`
	Results []Document `json:"results"`
}

const maxSearchSize = 100

// search is GET /api/search?q=&size=, read from the index's read alias,
// which hides tombstones. An empty q lists the newest documents.
func (s *Server) search(w http.ResponseWriter, r *http.Request) {
	if s.es == nil {
		writeError(w, &APIError{Status: http.StatusServiceUnavailable, Message: "search is not configured (no Elasticsearch URL)"})
		return
	}
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	size := 20
	if v := r.URL.Query().Get("size"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxSearchSize {
			writeError(w, badField("size", "must be a number from 1 to %d", maxSearchSize))
			return
		}
		size = n
	}
	// Core query types only: the test distribution has no analysis-common,
	// and the standard analyzer is enough for an example.
	var query any = map[string]any{"match_all": map[string]any{}}
	if q != "" {
		query = map[string]any{"bool": map[string]any{
			"should": []any{
				map[string]any{"match": map[string]any{"title": map[string]any{"query": q, "boost": 2}}},
				map[string]any{"match": map[string]any{"body": q}},
			},
			"minimum_should_match": 1,
		}}
	}
	body, _ := json.Marshal(map[string]any{
		"query":            query,
		"size":             size,
		"track_total_hits": true,
		"sort":             []any{"_score", map[string]any{"updated_at": map[string]any{"order": "desc", "unmapped_type": "date"}}},
	})
	res, err := s.es.Search(
		s.es.Search.WithContext(r.Context()),
		s.es.Search.WithIndex(s.index),
		s.es.Search.WithBody(bytes.NewReader(body)),
		s.es.Search.WithIgnoreUnavailable(true),
	)
	if err != nil {
		s.log.Error("search", "index", s.index, "err", err)
		writeError(w, &APIError{Status: http.StatusBadGateway, Message: "Elasticsearch is unavailable"})
		return
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(res.Body, 32<<20))
	if res.StatusCode == http.StatusNotFound {
		// The relay has not created the index yet: nothing is searchable.
		writeJSON(w, http.StatusOK, SearchResult{Query: q, Results: []Document{}})
		return
	}
	if res.StatusCode == http.StatusServiceUnavailable || res.StatusCode == http.StatusTooManyRequests {
		// E.g. an index the relay has just created whose shard is not
		// started yet: transient, so say when to come back.
		w.Header().Set("Retry-After", "1")
		writeError(w, &APIError{Status: http.StatusServiceUnavailable, Message: fmt.Sprintf("Elasticsearch is temporarily unavailable (%d); retry shortly", res.StatusCode)})
		return
	}
	if res.IsError() {
		s.log.Error("search", "index", s.index, "status", res.StatusCode, "response", truncate(string(raw), 500))
		writeError(w, &APIError{Status: http.StatusBadGateway, Message: fmt.Sprintf("Elasticsearch answered %d", res.StatusCode)})
		return
	}
	var parsed struct {
		Hits struct {
			Total struct {
				Value int `json:"value"`
			} `json:"total"`
			Hits []struct {
				Source Document `json:"_source"`
			} `json:"hits"`
		} `json:"hits"`
	}
	if err := json.Unmarshal(raw, &parsed); err != nil {
		writeError(w, &APIError{Status: http.StatusBadGateway, Message: "cannot parse Elasticsearch's answer"})
		return
	}
	out := SearchResult{Query: q, Total: parsed.Hits.Total.Value, Results: make([]Document, 0, len(parsed.Hits.Hits))}
	for _, h := range parsed.Hits.Hits {
		out.Results = append(out.Results, h.Source)
	}
	writeJSON(w, http.StatusOK, out)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
