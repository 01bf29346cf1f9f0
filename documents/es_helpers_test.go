package documents_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/relay/relaytest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// esEnv is a unique index name on the test server, its concrete index
// deleted when the test ends.
type esEnv struct {
	es   *elasticsearch.Client
	name string
}

func esSetup(t *testing.T) *esEnv {
	t.Helper()
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: indexer.SplitAddresses(schematest.ElasticsearchURL(t)), Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	x := &esEnv{es: es, name: schematest.Name("doct-")}
	t.Cleanup(x.cleanup)
	return x
}

func (x *esEnv) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ignore := true
	_, _ = indexer.Perform(ctx, x.es, "delete index", esapi.IndicesDeleteRequest{Index: []string{indexer.FirstIndex(x.name)}, IgnoreUnavailable: &ignore})
}

// stored is one document of the write alias, tombstones included.
type stored struct {
	Version int64
	Source  json.RawMessage
	Deleted bool
}

// state refreshes the index and returns every document behind its write
// alias, and how many tombstones a search on the name itself returns.
func (x *esEnv) state(t testing.TB) (docs map[string]stored, visibleTombstones int) {
	t.Helper()
	ctx := context.Background()
	if _, err := indexer.Perform(ctx, x.es, "refresh", esapi.IndicesRefreshRequest{Index: []string{indexer.WriteAlias(x.name)}}); err != nil {
		var re *indexer.ResponseError
		if errors.As(err, &re) && re.Status == 404 {
			return map[string]stored{}, 0 // nothing written yet
		}
		t.Fatal(err)
	}
	version := true
	size := 10000
	body, err := indexer.Perform(ctx, x.es, "search", esapi.SearchRequest{Index: []string{indexer.WriteAlias(x.name)}, Version: &version, Size: &size,
		Body: strings.NewReader(`{"query":{"match_all":{}}}`)})
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Hits struct {
			Hits []struct {
				ID      string          `json:"_id"`
				Version int64           `json:"_version"`
				Source  json.RawMessage `json:"_source"`
			} `json:"hits"`
		} `json:"hits"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	docs = make(map[string]stored, len(r.Hits.Hits))
	for _, h := range r.Hits.Hits {
		var tomb struct {
			Deleted bool `json:"outboxd_deleted"`
		}
		_ = json.Unmarshal(h.Source, &tomb)
		docs[h.ID] = stored{Version: h.Version, Source: h.Source, Deleted: tomb.Deleted}
	}
	body, err = indexer.Perform(ctx, x.es, "count", esapi.CountRequest{Index: []string{x.name},
		Body: strings.NewReader(`{"query":{"term":{"outboxd_deleted":true}}}`)})
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Count int `json:"count"`
	}
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	return docs, c.Count
}

// drift compares the index with what the definition returns now.
type drift struct{ missing, stale, extra, tombstonesVisible int }

func (d drift) zero() bool { return d == drift{} }

func (d drift) String() string {
	return fmt.Sprintf("missing %d, stale %d, extra %d, tombstones visible %d", d.missing, d.stale, d.extra, d.tombstonesVisible)
}

func compare(t testing.TB, want map[string]json.RawMessage, docs map[string]stored, visible int) drift {
	t.Helper()
	d := drift{tombstonesVisible: visible}
	for id, doc := range want {
		s, ok := docs[id]
		switch {
		case !ok || s.Deleted:
			d.missing++
		case !indexer.JSONEqual(doc, s.Source):
			d.stale++
		}
	}
	for id, s := range docs {
		if _, ok := want[id]; !ok && !s.Deleted {
			d.extra++
		}
	}
	return d
}

// expected runs the definition of index for every id idsSQL returns.
func (e *env) expected(t testing.TB, index, idsSQL string) map[string]json.RawMessage {
	t.Helper()
	ctx := context.Background()
	d, err := documents.Get(ctx, e.pool, e.schema, index)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := e.pool.QueryRow(ctx, e.sql(`SELECT coalesce(array_agg(x::text), '{}') FROM (`+idsSQL+`) s(x)`)).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	rows, err := e.pool.Query(ctx, d.SQL, ids)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]json.RawMessage{}
	for rows.Next() {
		var id string
		var doc []byte
		if err := rows.Scan(&id, &doc); err != nil {
			t.Fatal(err)
		}
		out[id] = doc
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// docSink is the relay's sink as cmd/outboxd wires it.
func docSink(t testing.TB, e *env, x *esEnv, reg prometheus.Registerer) *documents.Sink {
	t.Helper()
	es, err := indexer.NewSink(indexer.Options{Client: x.es, JSONB: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := documents.NewSink(documents.SinkOptions{Pool: e.pool, Schema: e.schema, Next: es, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// runRelay runs a relay over sink until the returned stop is called (or
// the test ends).
func (e *env) runRelay(t *testing.T, sink relay.Sink) (stop func()) {
	t.Helper()
	return relaytest.Start(t, relay.Config{Pool: e.pool, Schema: e.schema, Sink: sink, LeaseInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}
