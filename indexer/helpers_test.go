package indexer

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/internal/estest"
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

// The helpers every package's tests share, from internal/estest, under
// the names this package's tests have always called them by.
var (
	upsert      = estest.Upsert
	del         = estest.Delete
	mustWrite   = estest.MustWrite
	esCall      = estest.Call
	refresh     = estest.Refresh
	countOf     = estest.Count
	searchRead  = estest.SearchRead
	getDoc      = estest.Get
	isTombstone = estest.IsTombstone
)

type gotDoc = estest.Doc

func docN(v int64) string { return fmt.Sprintf(`{"title":"v%d","n":%d}`, v, v) }
