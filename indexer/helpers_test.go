package indexer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// setup returns a client for the test server and a unique index name
// whose concrete indices are deleted when the test ends.
func setup(t *testing.T) (*elasticsearch.Client, string) {
	t.Helper()
	es := client(t, schematest.ElasticsearchURL(t))
	name := schematest.Name("ixt-")
	t.Cleanup(func() { dropIndices(t, es, name) })
	return es, name
}

func client(t testing.TB, url string) *elasticsearch.Client {
	t.Helper()
	es, err := NewClient(ClientConfig{Addresses: SplitAddresses(url), Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// dropIndices deletes the concrete indices this test created: name itself
// (when a test made it concrete) and name-000001.
func dropIndices(t testing.TB, es *elasticsearch.Client, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ix := range []string{FirstIndex(name), name} {
		raw, err := perform(ctx, es, "resolve", esapi.IndicesResolveIndexRequest{Name: []string{ix}, IgnoreUnavailable: &ptrTrue})
		if err != nil {
			t.Logf("cleanup %s: %v", ix, err)
			continue
		}
		var r resolved
		_ = json.Unmarshal(raw, &r)
		if r.index(ix) {
			if _, err := perform(ctx, es, "delete index", esapi.IndicesDeleteRequest{Index: []string{ix}}); err != nil {
				t.Logf("cleanup %s: %v", ix, err)
			}
		}
	}
}

// openSearch reports whether es is OpenSearch, for the few checks whose API
// path or wording differs between the products.
func openSearch(t testing.TB, es *elasticsearch.Client) bool {
	t.Helper()
	_, os, err := Server(context.Background(), es)
	if err != nil {
		t.Fatal(err)
	}
	return os
}

// currentElasticsearch reports whether es is Elasticsearch 8.18 or later,
// for the tests that fake a current server's behaviour in front of it.
func currentElasticsearch(t testing.TB, es *elasticsearch.Client) bool {
	t.Helper()
	v, err := serverOf(context.Background(), es)
	if err != nil {
		t.Fatal(err)
	}
	return v.sourceOnErrorParam()
}

func newSink(t testing.TB, o Options) *Sink {
	t.Helper()
	s, err := NewSink(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func upsert(index, id string, version int64, doc string) outbox.Event {
	return outbox.Event{IndexName: index, SourceID: id, Version: version, Op: outbox.OpUpsert, Document: json.RawMessage(doc)}
}

func del(index, id string, version int64) outbox.Event {
	return outbox.Event{IndexName: index, SourceID: id, Version: version, Op: outbox.OpDelete}
}

func mustWrite(t testing.TB, s *Sink, events ...outbox.Event) []outbox.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := s.Write(ctx, events)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	if len(out) != len(events) {
		t.Fatalf("Write: %d outcomes for %d events", len(out), len(events))
	}
	return out
}

func statuses(out []outbox.Outcome) string {
	var b strings.Builder
	for i, o := range out {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(o.Status.String())
	}
	return b.String()
}

func esCall(t testing.TB, es *elasticsearch.Client, method, path, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, path, rd)
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

func refresh(t testing.TB, es *elasticsearch.Client, name string) {
	t.Helper()
	if st, b := esCall(t, es, "POST", "/"+name+"/_refresh", ""); st != 200 {
		t.Fatalf("refresh: %d %s", st, b)
	}
}

// searchRead returns every document visible through the name N itself,
// the view applications search.
func searchRead(t testing.TB, es *elasticsearch.Client, name string) map[string]json.RawMessage {
	t.Helper()
	refresh(t, es, name)
	st, b := esCall(t, es, "POST", "/"+name+"/_search", `{"size":10000,"query":{"match_all":{}}}`)
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

type gotDoc struct {
	Found   bool            `json:"found"`
	Version int64           `json:"_version"`
	Source  json.RawMessage `json:"_source"`
}

func getDoc(t testing.TB, es *elasticsearch.Client, name, id string) gotDoc {
	t.Helper()
	st, b := esCall(t, es, "GET", "/"+name+"/_doc/"+id, "")
	if st != 200 && st != 404 {
		t.Fatalf("get %s: %d %s", id, st, b)
	}
	var d gotDoc
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

func isTombstone(src json.RawMessage) bool {
	var t struct {
		Deleted bool `json:"outboxd_deleted"`
	}
	return json.Unmarshal(src, &t) == nil && t.Deleted
}

func docN(v int64) string { return fmt.Sprintf(`{"title":"v%d","n":%d}`, v, v) }
