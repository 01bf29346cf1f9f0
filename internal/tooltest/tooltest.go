// Package tooltest holds the fixtures the operator tools' tests share
// (repair, rebuild, backfill, reconcile and internal/scan), on top of
// internal/estest and schema/schematest: a client and a sink on the test
// servers, an index family made by hand (Family), and a source table with
// writers and a relay (Source).
//
// It imports package indexer, so indexer's own tests use estest instead;
// and no tool package, so that every tool's internal tests may use it.
package tooltest

import (
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// Client is a client of the test server (ELASTICSEARCH_URL).
func Client(t testing.TB) *elasticsearch.Client {
	t.Helper()
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{schematest.ElasticsearchURL(t)}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// Index is a client and a unique index name N with prefix; the concrete
// indices N-0* are deleted when the test ends.
func Index(t testing.TB, prefix string) (*elasticsearch.Client, string) {
	t.Helper()
	es := Client(t)
	name := schematest.Name(prefix)
	estest.DropAll(t, es, name+"-0*")
	return es, name
}

// NewSink is indexer.NewSink, failing the test on an error.
func NewSink(t testing.TB, o indexer.Options) *indexer.Sink {
	t.Helper()
	s, err := indexer.NewSink(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
