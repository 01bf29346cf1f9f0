// Package estest holds the Elasticsearch helpers the tests of every
// package share: raw requests, what a searcher and a GET see, the events
// the sink writes, and index cleanup.
//
// It never imports package indexer, so that indexer's own (internal)
// tests use it too: a client is always the caller's (indexer.NewClient,
// whose transport answers the v8 client's product check on OpenSearch).
// The operator tools' fixtures built on it are in internal/tooltest.
package estest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/outbox"
)

// Call sends a raw request and returns its status and body.
func Call(t testing.TB, es *elasticsearch.Client, method, path, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := es.Perform(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// Must is Call that fails the test on a non-2xx answer; it returns the
// body.
func Must(t testing.TB, es *elasticsearch.Client, method, path, body string) []byte {
	t.Helper()
	st, b := Call(t, es, method, path, body)
	if st >= 300 {
		t.Fatalf("%s %s: status %d: %s", method, path, st, b)
	}
	return b
}

// Refresh makes every write to name visible to searches.
func Refresh(t testing.TB, es *elasticsearch.Client, name string) {
	t.Helper()
	if st, b := Call(t, es, "POST", "/"+name+"/_refresh", ""); st != 200 || !allShards(b) {
		t.Fatalf("refresh: %d %s", st, b)
	}
}

// Count runs _count of query on target.
func Count(t testing.TB, es *elasticsearch.Client, target, query string) int {
	t.Helper()
	st, b := Call(t, es, "POST", "/"+target+"/_count", query)
	var r struct {
		Count int `json:"count"`
	}
	if st != 200 || !allShards(b) || json.Unmarshal(b, &r) != nil {
		t.Fatalf("count %s: %d %s", target, st, b)
	}
	return r.Count
}

// allShards says whether an answer's _shards reports no failure. A refresh
// or a count that failed on a shard still answers 200; a search after the
// one, or the number of the other, would miss writes and blame the code.
func allShards(b []byte) bool {
	var r struct {
		Shards struct {
			Failed int `json:"failed"`
		} `json:"_shards"`
	}
	return json.Unmarshal(b, &r) == nil && r.Shards.Failed == 0
}

// SearchRead returns every document visible through the name N itself,
// the view applications search, by _id; an _id seen twice fails the test.
func SearchRead(t testing.TB, es *elasticsearch.Client, name string) map[string]json.RawMessage {
	t.Helper()
	Refresh(t, es, name)
	st, b := Call(t, es, "POST", "/"+name+"/_search", `{"size":10000,"query":{"match_all":{}}}`)
	if st != 200 {
		t.Fatalf("search: %d %s", st, b)
	}
	var r struct {
		Hits struct {
			Hits []struct {
				ID     string          `json:"_id"`
				Source json.RawMessage `json:"_source"`
			} `json:"hits"`
		} `json:"hits"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	out := make(map[string]json.RawMessage)
	for _, h := range r.Hits.Hits {
		if _, dup := out[h.ID]; dup {
			t.Fatalf("id %s appears twice", h.ID)
		}
		out[h.ID] = h.Source
	}
	return out
}

// Doc is a document as a GET returns it.
type Doc struct {
	Found   bool            `json:"found"`
	Version int64           `json:"_version"`
	Source  json.RawMessage `json:"_source"`
}

// Get reads id through name. A GET ignores alias filters: a deleted
// document comes back as its tombstone (see IsTombstone).
func Get(t testing.TB, es *elasticsearch.Client, name, id string) Doc {
	t.Helper()
	st, b := Call(t, es, "GET", "/"+name+"/_doc/"+id, "")
	if st != 200 && st != 404 {
		t.Fatalf("get %s: %d %s", id, st, b)
	}
	var d Doc
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// Tombstone is a tombstone's source, as the sink writes one for a delete.
const Tombstone = `{"outboxd_deleted":true,"outboxd_deleted_at":"2024-05-01T00:00:00Z"}`

// IsTombstone reports whether src is a tombstone.
func IsTombstone(src json.RawMessage) bool {
	var t struct {
		Deleted bool `json:"outboxd_deleted"`
	}
	return json.Unmarshal(src, &t) == nil && t.Deleted
}

// Upsert is an upsert event of doc.
func Upsert(index, id string, version int64, doc string) outbox.Event {
	return outbox.Event{IndexName: index, SourceID: id, Version: version, Op: outbox.OpUpsert, Document: json.RawMessage(doc)}
}

// Delete is a delete event.
func Delete(index, id string, version int64) outbox.Event {
	return outbox.Event{IndexName: index, SourceID: id, Version: version, Op: outbox.OpDelete}
}

// Writer is a sink: an *indexer.Sink, or one of the tests' wrappers.
type Writer interface {
	Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error)
}

// MustWrite writes events and fails the test when the sink returns an
// error or not one outcome per event.
func MustWrite(t testing.TB, w Writer, events ...outbox.Event) []outbox.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := w.Write(ctx, events)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	if len(out) != len(events) {
		t.Fatalf("Write: %d outcomes for %d events", len(out), len(events))
	}
	return out
}

// DropAll deletes, when the test ends, every concrete index whose name
// matches one of patterns (a wildcard pattern such as N-0*). Aliases go
// with their indices; a pattern that matches nothing is fine.
func DropAll(t testing.TB, es *elasticsearch.Client, patterns ...string) {
	t.Cleanup(func() {
		for _, p := range patterns {
			st, b := Call(t, es, "DELETE", "/"+p+"?ignore_unavailable=true&allow_no_indices=true&expand_wildcards=all", "")
			if st != 200 && st != 404 {
				t.Logf("cleanup %s: %d %s", p, st, b)
			}
		}
	})
}
