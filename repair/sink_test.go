package repair

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
)

// The backfill and gate tests run the sink itself next to the operator
// tools: these are the sink-side helpers they share (package indexer's own
// test helpers are not visible from here).

func newSink(t testing.TB, o indexer.Options) *indexer.Sink {
	t.Helper()
	s, err := indexer.NewSink(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustWrite(t testing.TB, s *indexer.Sink, events ...outbox.Event) []outbox.Outcome {
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

func upsert(index, id string, version int64, doc string) outbox.Event {
	return outbox.Event{IndexName: index, SourceID: id, Version: version, Op: outbox.OpUpsert, Document: json.RawMessage(doc)}
}

func del(index, id string, version int64) outbox.Event {
	return outbox.Event{IndexName: index, SourceID: id, Version: version, Op: outbox.OpDelete}
}

// esCall sends a raw request and returns its status and body.
func esCall(t testing.TB, es *elasticsearch.Client, method, path, body string) (int, []byte) {
	t.Helper()
	b, st := (&testIndex{es: es}).rawStatus(t, method, path, body)
	return st, b
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
