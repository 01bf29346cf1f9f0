package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// indexEnv is a testEnv whose events can be delivered to a real index by
// the indexer's sink, in any order and as often as a test likes.
type indexEnv struct {
	*testEnv
	es    *elasticsearch.Client
	sink  *indexer.Sink
	index string
}

func setupIndex(t *testing.T, configure ...func(*Config)) *indexEnv {
	t.Helper()
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{schematest.ElasticsearchURL(t)}})
	if err != nil {
		t.Fatal(err)
	}
	index := schematest.Name("tut-")
	env := setup(t, append([]func(*Config){func(c *Config) {
		c.Index = index
		c.Elasticsearch = es
	}}, configure...)...)
	t.Cleanup(func() {
		// Deleting the one concrete index removes both aliases with it.
		res, err := es.Indices.Delete([]string{indexer.FirstIndex(index)}, es.Indices.Delete.WithIgnoreUnavailable(true))
		if err != nil {
			t.Logf("delete index %s: %v", indexer.FirstIndex(index), err)
			return
		}
		res.Body.Close()
	})
	sink, err := indexer.NewSink(indexer.Options{Client: es})
	if err != nil {
		t.Fatal(err)
	}
	return &indexEnv{testEnv: env, es: es, sink: sink, index: index}
}

// outboxEvents reads the committed events back as the relay would.
func (e *indexEnv) outboxEvents(t *testing.T) []outbox.Event {
	t.Helper()
	events, err := e.readEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return events
}

func (e *indexEnv) readEvents(ctx context.Context) ([]outbox.Event, error) {
	rows, err := e.pool.Query(ctx, `SELECT id, index_name, source_id, version, op, document, coalesce(event_type, ''), headers
		FROM "`+e.outbox+`".events ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outbox.Event
	for rows.Next() {
		var ev outbox.Event
		var op string
		var doc []byte
		if err := rows.Scan(&ev.ID, &ev.IndexName, &ev.SourceID, &ev.Version, &op, &doc, &ev.EventType, &ev.Headers); err != nil {
			return nil, err
		}
		ev.Op, ev.Document = outbox.Op(op), doc
		out = append(out, ev)
	}
	return out, rows.Err()
}

// deliver writes events through the sink and returns the outcome counts.
func (e *indexEnv) deliver(t *testing.T, events []outbox.Event) map[outbox.Status]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := e.sink.Write(ctx, events)
	if err != nil {
		t.Fatalf("sink: %v", err)
	}
	counts := map[outbox.Status]int{}
	for i, o := range out {
		if o.Status == outbox.Rejected || o.Status == outbox.Retry {
			t.Fatalf("event %d (%s v%d): %s: %s", i, events[i].SourceID, events[i].Version, o.Status, o.Reason)
		}
		counts[o.Status]++
	}
	res, err := e.es.Indices.Refresh(e.es.Indices.Refresh.WithIndex(e.index))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return counts
}

// searchable is what GET /api/search shows: id -> title.
func (e *indexEnv) searchable(t *testing.T) map[string]string {
	t.Helper()
	r := e.do(t, "GET", "/api/search?size=100&q=", "", "", "")
	if r.status != http.StatusOK {
		t.Fatalf("search: %d %s", r.status, r.body)
	}
	var res SearchResult
	r.json(t, &res)
	out := map[string]string{}
	for _, d := range res.Results {
		out[d.ID] = d.Title
	}
	if res.Total != len(out) {
		t.Fatalf("search total %d but %d distinct documents: %s", res.Total, len(out), r.body)
	}
	return out
}

// stored is what PostgreSQL holds: id -> title of live tutorials.
func (e *indexEnv) stored(t *testing.T) map[string]string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT id::text, title FROM "`+e.tables+`".tutorials WHERE deleted_at IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, title string
		if err := rows.Scan(&id, &title); err != nil {
			t.Fatal(err)
		}
		out[id] = title
	}
	return out
}

// docCount counts every document in the concrete index, tombstones included.
func (e *indexEnv) docCount(t *testing.T) int {
	t.Helper()
	res, err := e.es.Count(e.es.Count.WithIndex(indexer.WriteAlias(e.index)))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var c struct {
		Count int `json:"count"`
	}
	if err := json.NewDecoder(res.Body).Decode(&c); err != nil {
		t.Fatal(err)
	}
	return c.Count
}

func sameMap(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// story writes through the API: A created and edited twice, B created and
// deleted, C created. It returns their ids.
func (e *indexEnv) story(t *testing.T) (a, b, c string) {
	t.Helper()
	a = e.create(t, "alice", "a", `{"title":"A v1","body":"first"}`).ID
	b = e.create(t, "alice", "b", `{"title":"B v1","body":"doomed"}`).ID
	c = e.create(t, "alice", "c", `{"title":"C v1","body":"steady"}`).ID
	for i, title := range []string{"A v2", "A v3"} {
		if r := e.do(t, "PUT", "/api/tutorials/"+a, "alice", "a-edit-"+string(rune('0'+i)), `{"title":"`+title+`","body":"edited"}`); r.status != http.StatusOK {
			t.Fatalf("edit: %d %s", r.status, r.body)
		}
	}
	if r := e.do(t, "DELETE", "/api/tutorials/"+b, "alice", "b-delete", ""); r.status != http.StatusOK {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	return a, b, c
}

func eventsOf(events []outbox.Event, sourceID string) []outbox.Event {
	var out []outbox.Event
	for _, ev := range events {
		if ev.SourceID == sourceID {
			out = append(out, ev)
		}
	}
	return out
}

func TestIndexConvergence(t *testing.T) {
	t.Parallel()

	t.Run("duplicated index events leave the document count unchanged", func(t *testing.T) {
		t.Parallel()
		env := setupIndex(t)
		env.story(t)
		// A retried create and a duplicate burst add no events.
		env.do(t, "POST", "/api/tutorials", "alice", "a", `{"title":"A v1","body":"first"}`)
		events := env.outboxEvents(t)
		if len(events) != 6 {
			t.Fatalf("want 6 outbox events (3 creates, 2 edits, 1 delete), got %d", len(events))
		}
		first := env.deliver(t, events)
		docs, live := env.docCount(t), env.searchable(t)
		if docs != 3 || len(live) != 2 {
			t.Fatalf("after one delivery: want 3 documents (one a tombstone) and 2 searchable, got %d and %v", docs, live)
		}
		for round := range 3 {
			counts := env.deliver(t, events)
			if counts[outbox.Stale] != len(events) {
				t.Fatalf("redelivery %d: want all %d events stale, got %v", round, len(events), counts)
			}
		}
		// Duplicates inside one batch too.
		env.deliver(t, append(append([]outbox.Event{}, events...), events...))
		if got := env.docCount(t); got != docs {
			t.Fatalf("document count grew from %d to %d", docs, got)
		}
		if got := env.searchable(t); !sameMap(got, env.stored(t)) {
			t.Fatalf("search %v, PostgreSQL %v", got, env.stored(t))
		}
		t.Logf("first delivery %v; 3 full redeliveries all stale; documents stay %d", first, docs)
	})

	t.Run("an old version arriving after a newer one cannot overwrite it", func(t *testing.T) {
		t.Parallel()
		env := setupIndex(t)
		a, _, _ := env.story(t)
		history := eventsOf(env.outboxEvents(t), a) // v1, v2, v3
		if len(history) != 3 || history[2].Version != 3 {
			t.Fatalf("want A's versions 1..3, got %+v", history)
		}
		if c := env.deliver(t, history[2:]); c[outbox.Applied] != 1 {
			t.Fatalf("v3: want applied, got %v", c)
		}
		for _, old := range []outbox.Event{history[1], history[0]} {
			if c := env.deliver(t, []outbox.Event{old}); c[outbox.Stale] != 1 {
				t.Fatalf("v%d after v3: want stale, got %v", old.Version, c)
			}
		}
		if got := env.searchable(t); got[a] != "A v3" {
			t.Fatalf("want A at v3, search shows %q", got[a])
		}
	})

	t.Run("a delete followed by a late older update stays deleted", func(t *testing.T) {
		t.Parallel()
		env := setupIndex(t)
		_, b, _ := env.story(t)
		history := eventsOf(env.outboxEvents(t), b) // upsert v1, delete v2
		if len(history) != 2 || history[1].Op != outbox.OpDelete || history[1].Version != 2 {
			t.Fatalf("want B's upsert v1 and delete v2, got %+v", history)
		}
		env.deliver(t, history[1:])
		if c := env.deliver(t, history[:1]); c[outbox.Stale] != 1 {
			t.Fatalf("late update: want stale, got %v", c)
		}
		if got := env.searchable(t); got[b] != "" {
			t.Fatalf("deleted B came back: %q", got[b])
		}
		if r := env.do(t, "GET", "/api/search?q="+url.QueryEscape("doomed"), "", "", ""); !strings.Contains(string(r.body), `"total":0`) {
			t.Fatalf("search for B's body finds it: %s", r.body)
		}
	})

	t.Run("shuffled replays of every event converge to PostgreSQL", func(t *testing.T) {
		t.Parallel()
		env := setupIndex(t)
		env.story(t)
		// More traffic: a few more tutorials, edited and deleted.
		for i := range 5 {
			k := "more-" + string(rune('a'+i))
			tut := env.create(t, "bob", k, `{"title":"More `+k+`"}`)
			env.do(t, "PUT", "/api/tutorials/"+tut.ID, "bob", k+"-e", `{"title":"More `+k+` edited"}`)
			if i%2 == 0 {
				env.do(t, "DELETE", "/api/tutorials/"+tut.ID, "bob", k+"-d", "")
			}
		}
		events := env.outboxEvents(t)
		rng := rand.New(rand.NewPCG(1, 2))
		for round := range 5 {
			shuffled := append([]outbox.Event{}, events...)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			// Deliver in small random batches, as pages of a relay might.
			for len(shuffled) > 0 {
				n := min(len(shuffled), 1+rng.IntN(4))
				env.deliver(t, shuffled[:n])
				shuffled = shuffled[n:]
			}
			got, want := env.searchable(t), env.stored(t)
			if !sameMap(got, want) {
				keys := func(m map[string]string) []string {
					var out []string
					for k, v := range m {
						out = append(out, k[:8]+"="+v)
					}
					sort.Strings(out)
					return out
				}
				t.Fatalf("round %d: search %v, PostgreSQL %v", round, keys(got), keys(want))
			}
		}
		t.Logf("%d events, 5 shuffled replays: search equals PostgreSQL's %d live tutorials", len(events), len(env.stored(t)))
	})
}
