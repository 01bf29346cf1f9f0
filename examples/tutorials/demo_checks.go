package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// converge polls search until it shows exactly what PostgreSQL holds.
func (d *demo) converge(ctx context.Context) error {
	d.say("waiting for the relay to bring the index in step (expect %d tutorials)...", len(d.want))
	deadline := time.Now().Add(d.Wait)
	var last SearchResult
	var problem string
	for {
		r, err := d.call(ctx, "GET", "/api/search?size=100&q="+url.QueryEscape(d.run), "", nil)
		if err != nil {
			return err
		}
		switch r.status {
		case http.StatusOK:
			last = SearchResult{}
			if err := json.Unmarshal(r.body, &last); err != nil {
				return fmt.Errorf("demo: search: %w", err)
			}
			problem = d.check(last)
		case http.StatusServiceUnavailable, http.StatusBadGateway:
			// The index may be brand new, its shard still starting.
			problem = fmt.Sprintf("search answered %d: %s", r.status, bytes.TrimSpace(r.body))
		default:
			return expect(r, http.StatusOK, "search")
		}
		if problem == "" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: search did not converge within %s: %s", d.Wait, problem)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	sort.Slice(last.Results, func(i, j int) bool { return last.Results[i].Title < last.Results[j].Title })
	d.say("search converged: %d documents for %q, edited titles present, deleted ones gone:", last.Total, d.run)
	for _, doc := range last.Results {
		d.say("  v%-2d %s  %s", doc.Version, doc.ID, doc.Title)
	}
	return nil
}

// check says what is still wrong with a search result, or "".
func (d *demo) check(res SearchResult) string {
	seen := map[string]bool{}
	for _, doc := range res.Results {
		if d.gone[doc.ID] {
			return fmt.Sprintf("deleted tutorial %s is still searchable", doc.ID)
		}
		want, ok := d.want[doc.ID]
		if !ok {
			return fmt.Sprintf("unexpected document %s", doc.ID)
		}
		if doc.Title != want {
			return fmt.Sprintf("document %s has title %q, want %q", doc.ID, doc.Title, want)
		}
		seen[doc.ID] = true
	}
	if len(seen) != len(d.want) || res.Total != len(d.want) {
		return fmt.Sprintf("%d of %d documents searchable", len(seen), len(d.want))
	}
	return ""
}

// metrics prints the write-side counters.
func (d *demo) metrics(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, "GET", d.BaseURL+"/metrics", nil)
	if err != nil {
		return err
	}
	res, err := d.Client.Do(req)
	if err != nil {
		return fmt.Errorf("demo: metrics: %w", err)
	}
	defer res.Body.Close()
	d.say("API metrics (%s/metrics):", d.BaseURL)
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "outboxd_idempotency_") || strings.HasPrefix(line, "outboxd_unique_key_") ||
			strings.HasPrefix(line, "outboxd_api_requests_total") {
			d.say("  %s", line)
		}
	}
	return sc.Err()
}
