package indexer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

func TestSinkOutcomes(t *testing.T) {
	t.Parallel()

	t.Run("a new version is applied and a lower one is stale", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		if got := statuses(mustWrite(t, s, upsert(name, "a", 5, docN(5)))); got != "applied" {
			t.Fatalf("first write: %s", got)
		}
		if got := statuses(mustWrite(t, s, upsert(name, "a", 3, docN(3)))); got != "stale" {
			t.Fatalf("lower version: %s", got)
		}
		if d := getDoc(t, es, name, "a"); d.Version != 5 || !strings.Contains(string(d.Source), `"v5"`) {
			t.Fatalf("stored: version %d source %s", d.Version, d.Source)
		}
	})

	t.Run("a mapping conflict is rejected with Elasticsearch's reason", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		mustWrite(t, s, upsert(name, "a", 1, `{"n":1}`))
		out := mustWrite(t, s, upsert(name, "b", 1, `{"n":"not a number"}`))
		// document_parsing_exception from Elasticsearch 8.8 on, mapper_parsing_exception before and on OpenSearch
		if out[0].Status != outbox.Rejected || !strings.Contains(out[0].Reason, "_parsing_exception: ") || !strings.Contains(out[0].Reason, "failed to parse field [n]") {
			t.Fatalf("got %v %q", out[0].Status, out[0].Reason)
		}
	})

	t.Run("with JSONB documents are not parsed again, but only objects are sent", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es, JSONB: true})
		// jsonb text as PostgreSQL prints it.
		out := mustWrite(t, s, upsert(name, "a", 1, `{"n": 1, "tags": ["x", "y"]}`), upsert(name, "b", 1, `[1]`),
			upsert(name, "c", 1, `{"n": `))
		if out[0].Status != outbox.Applied {
			t.Fatalf("a jsonb object: %v %q", out[0].Status, out[0].Reason)
		}
		if out[1].Status != outbox.Rejected || !strings.Contains(out[1].Reason, "must be a JSON object") {
			t.Fatalf("an array: %v %q", out[1].Status, out[1].Reason)
		}
		// Never from PostgreSQL; it shows the sink left the parsing to
		// Elasticsearch, which refuses the item alone.
		if out[2].Status != outbox.Rejected || strings.Contains(out[2].Reason, "document: invalid JSON") {
			t.Fatalf("broken JSON: %v %q", out[2].Status, out[2].Reason)
		}
	})

	t.Run("a delete of a missing id is applied and leaves a tombstone", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		if got := statuses(mustWrite(t, s, del(name, "ghost", 4))); got != "applied" {
			t.Fatalf("delete: %s", got)
		}
		d := getDoc(t, es, name, "ghost")
		if !d.Found || d.Version != 4 || !isTombstone(d.Source) {
			t.Fatalf("stored: %+v %s", d, d.Source)
		}
		if got := statuses(mustWrite(t, s, upsert(name, "ghost", 2, docN(2)))); got != "stale" {
			t.Fatalf("older upsert after delete: %s", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 0 {
			t.Fatalf("read alias shows %v", docs)
		}
	})

	t.Run("one bulk mixing every outcome reports each item on its own", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		mustWrite(t, s, upsert(name, "old", 9, `{"n":9}`), upsert(name, "gone", 1, `{"n":1}`))
		out := mustWrite(t, s,
			upsert(name, "new", 1, `{"n":1}`),                                     // applied
			upsert(name, "old", 2, `{"n":2}`),                                     // stale
			upsert(name, "bad", 1, `{"n":{"x":1}}`),                               // rejected: object into a long
			del(name, "gone", 2),                                                  // applied
			del(name, "never", 1),                                                 // applied: delete of a missing id
			upsert(name, "", 1, `{"n":1}`),                                        // rejected before sending
			upsert(name, "arr", 1, `[1,2]`),                                       // rejected: not an object
			upsert(name, "new", 1, `{"n":1}`),                                     // duplicate in the batch: stale
			outbox.Event{IndexName: name, SourceID: "x", Version: 1, Op: "patch"}, // rejected
		)
		want := "stale stale rejected applied applied rejected rejected applied rejected"
		if got := statuses(out); got != want {
			t.Fatalf("got  %s\nwant %s\nreasons: %+v", got, want, out)
		}
		docs := searchRead(t, es, name)
		if len(docs) != 2 || docs["new"] == nil || string(docs["old"]) != `{"n":9}` {
			t.Fatalf("read alias: %v", docs)
		}
	})

	t.Run("a multi-line document is sent on one line", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		out := mustWrite(t, s, upsert(name, "pretty", 1, "{\n  \"title\": \"a\\nb\"\n}"), upsert(name, "next", 1, `{"title":"c"}`))
		if got := statuses(out); got != "applied applied" {
			t.Fatalf("got %s %+v", got, out)
		}
		if docs := searchRead(t, es, name); len(docs) != 2 {
			t.Fatalf("read alias: %v", docs)
		}
	})

	t.Run("ids and index names needing JSON escapes work", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		id := "q\"uo\\te/é"
		if got := statuses(mustWrite(t, s, upsert(name, id, 1, `{"n":1}`))); got != "applied" {
			t.Fatalf("got %s", got)
		}
		if docs := searchRead(t, es, name); docs[id] == nil {
			t.Fatalf("read alias: %v", docs)
		}
	})
}

func TestSinkDedupe(t *testing.T) {
	t.Parallel()

	t.Run("only the highest version of a document in one write is sent", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		out := mustWrite(t, s, upsert(name, "a", 1, docN(1)), upsert(name, "a", 3, docN(3)), upsert(name, "a", 2, docN(2)))
		if got := statuses(out); got != "stale applied stale" {
			t.Fatalf("got %s", got)
		}
		if d := getDoc(t, es, name, "a"); d.Version != 3 {
			t.Fatalf("version %d", d.Version)
		}
	})

	t.Run("when the highest version is rejected the lower ones are still sent", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		mustWrite(t, s, upsert(name, "seed", 1, `{"n":1}`))
		out := mustWrite(t, s, upsert(name, "a", 1, `{"n":1}`), upsert(name, "a", 2, `{"n":2}`), upsert(name, "a", 3, `{"n":"bad"}`))
		if got := statuses(out); got != "stale applied rejected" {
			t.Fatalf("got %s %+v", got, out)
		}
		if d := getDoc(t, es, name, "a"); d.Version != 2 {
			t.Fatalf("version %d", d.Version)
		}
	})

	t.Run("two documents under one version: the later write wins", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		mustWrite(t, s, upsert(name, "a", 4, `{"who":"first"}`))
		if got := statuses(mustWrite(t, s, upsert(name, "a", 4, `{"who":"second"}`))); got != "applied" {
			t.Fatalf("got %s", got)
		}
		if d := getDoc(t, es, name, "a"); d.Version != 4 || string(d.Source) != `{"who":"second"}` {
			t.Fatalf("stored %d %s", d.Version, d.Source)
		}
		if got := statuses(mustWrite(t, s, del(name, "a", 4))); got != "applied" {
			t.Fatalf("delete at the same version: %s", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 0 {
			t.Fatalf("read alias %v", docs)
		}
	})
}

func TestSinkReplay(t *testing.T) {
	t.Parallel()

	t.Run("replaying every event a second time is stale and changes nothing", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es, MaxBatchDocs: 7})
		var events []outbox.Event
		for i := range 40 {
			id := fmt.Sprintf("doc-%d", i%13)
			v := int64(i + 1)
			if i%5 == 4 {
				events = append(events, del(name, id, v))
			} else {
				events = append(events, upsert(name, id, v, docN(v)))
			}
		}
		for i := 0; i < len(events); i += 10 {
			for _, o := range mustWrite(t, s, events[i:min(i+10, len(events))]...) {
				if o.Status != outbox.Applied && o.Status != outbox.Stale {
					t.Fatalf("first pass: %+v", o)
				}
			}
		}
		before := versions(t, es, name, 13)
		for i := 0; i < len(events); i += 10 {
			out := mustWrite(t, s, events[i:min(i+10, len(events))]...)
			for j, o := range out {
				if o.Status != outbox.Stale {
					t.Fatalf("replay of event %d: %v %q", i+j, o.Status, o.Reason)
				}
			}
		}
		if after := versions(t, es, name, 13); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("versions changed:\n%v\n%v", before, after)
		}
	})
}

// versions returns _version and _seq_no of doc-0..doc-n-1: a replay that
// rewrote a document would move its _seq_no.
func versions(t *testing.T, c *elasticsearch.Client, name string, n int) []string {
	t.Helper()
	var out []string
	for i := range n {
		st, b := esCall(t, c, "GET", fmt.Sprintf("/%s/_doc/doc-%d", name, i), "")
		var d struct {
			Version int64 `json:"_version"`
			SeqNo   int64 `json:"_seq_no"`
		}
		_ = json.Unmarshal(b, &d)
		out = append(out, fmt.Sprintf("%d:%d/%d", st, d.Version, d.SeqNo))
	}
	return out
}

func TestSinkResurrection(t *testing.T) {
	t.Parallel()

	// A full Elasticsearch restart would also drop the in-memory delete
	// versions, but the test server is shared by every engineer's tests;
	// closing and reopening the index reloads the shard from disk the same
	// way without taking the node away from them.
	t.Run("a delete stays deleted after gc_deletes and a close/open, until a newer version", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es, IndexSpec: []byte(`{"settings":{"index":{"number_of_shards":1,"number_of_replicas":0,"gc_deletes":"1s"}}}`)})
		mustWrite(t, s, upsert(name, "a", 1, docN(1)))
		if got := statuses(mustWrite(t, s, del(name, "a", 5))); got != "applied" {
			t.Fatalf("delete: %s", got)
		}
		time.Sleep(1500 * time.Millisecond)
		refresh(t, es, name)
		if st, b := esCall(t, es, "POST", "/"+name+"/_flush", ""); st != 200 {
			t.Fatalf("flush: %d %s", st, b)
		}
		if got := statuses(mustWrite(t, s, upsert(name, "a", 3, docN(3)))); got != "stale" {
			t.Fatalf("older upsert after gc_deletes: %s", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 0 {
			t.Fatalf("resurrected: %v", docs)
		}
		if d := getDoc(t, es, name, "a"); d.Version != 5 || !isTombstone(d.Source) {
			t.Fatalf("GET shows %d %s", d.Version, d.Source)
		}

		for _, op := range []string{"_close", "_open"} {
			if st, b := esCall(t, es, "POST", "/"+FirstIndex(name)+"/"+op+"?wait_for_active_shards=1", ""); st != 200 {
				t.Fatalf("%s: %d %s", op, st, b)
			}
		}
		if st, b := esCall(t, es, "GET", "/_cluster/health/"+FirstIndex(name)+"?wait_for_status=green&timeout=30s", ""); st != 200 {
			t.Fatalf("health: %d %s", st, b)
		}
		if got := statuses(mustWrite(t, s, upsert(name, "a", 4, docN(4)))); got != "stale" {
			t.Fatalf("older upsert after close/open: %s", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 0 {
			t.Fatalf("resurrected after close/open: %v", docs)
		}
		if got := statuses(mustWrite(t, s, upsert(name, "a", 6, docN(6)))); got != "applied" {
			t.Fatalf("newer upsert: %s", got)
		}
		if docs := searchRead(t, es, name); !strings.Contains(string(docs["a"]), `"v6"`) {
			t.Fatalf("not visible again: %v", docs)
		}
	})
}

func TestSinkConverges(t *testing.T) {
	t.Parallel()

	t.Run("random interleavings, duplicates and deletes converge to the newest version", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		const seeds, ids = 30, 20
		type want struct {
			version int64
			deleted bool
		}
		expect := make(map[string]want)
		var all []outbox.Event
		for seed := range seeds {
			rng := rand.New(rand.NewPCG(uint64(seed), 42))
			var events []outbox.Event
			for i := range ids {
				id := fmt.Sprintf("s%d-%d", seed, i)
				n := 1 + rng.IntN(15)
				for v := int64(1); v <= int64(n); v++ {
					if rng.IntN(4) == 0 {
						events = append(events, del(name, id, v))
					} else {
						events = append(events, upsert(name, id, v, fmt.Sprintf(`{"id":%q,"v":%d}`, id, v)))
					}
				}
				last := events[len(events)-1]
				expect[id] = want{last.Version, last.Op == outbox.OpDelete}
			}
			for range len(events) / 3 {
				events = append(events, events[rng.IntN(len(events))])
			}
			rng.Shuffle(len(events), func(i, j int) { events[i], events[j] = events[j], events[i] })
			all = append(all, events...)
		}
		t.Logf("%d events over %d documents", len(all), len(expect))
		rng := rand.New(rand.NewPCG(7, 7))
		s := newSink(t, Options{Client: es, MaxBatchDocs: 1 + rng.IntN(25), Workers: 3})
		for i := 0; i < len(all); {
			n := min(1+rng.IntN(120), len(all)-i)
			for j, o := range mustWrite(t, s, all[i:i+n]...) {
				if o.Status != outbox.Applied && o.Status != outbox.Stale {
					t.Fatalf("event %d: %v %q", i+j, o.Status, o.Reason)
				}
			}
			i += n
		}
		docs := searchRead(t, es, name)
		for id, w := range expect {
			src, visible := docs[id]
			switch {
			case w.deleted && visible:
				t.Errorf("%s: deleted at v%d but visible: %s", id, w.version, src)
			case !w.deleted && !visible:
				t.Errorf("%s: missing, want v%d", id, w.version)
			case !w.deleted:
				var d struct{ V int64 }
				_ = json.Unmarshal(src, &d)
				if d.V != w.version {
					t.Errorf("%s: shows v%d, want v%d", id, d.V, w.version)
				}
			}
		}
		if len(docs) > len(expect) {
			t.Errorf("read alias holds %d documents, at most %d expected", len(docs), len(expect))
		}
	})
}

func TestCheckEvent(t *testing.T) {
	t.Parallel()
	cases := []struct {
		e    outbox.Event
		want string
	}{
		{upsert("x", "", 1, `{}`), "source_id: must not be empty"},
		{upsert("x", strings.Repeat("a", 513), 1, `{}`), "source_id: Elasticsearch ids are at most 512 bytes"},
		{upsert("x", "a", 0, `{}`), "version: must be >= 1"},
		{upsert("x", "a", 1, `[]`), "document: must be a JSON object"},
		{upsert("x", "a", 1, `{"a":`), "document: invalid JSON"},
		{upsert("x", "a", 1, ``), "document: must be a JSON object"},
		{outbox.Event{IndexName: "x", SourceID: "a", Version: 1, Op: "x"}, "op: must be"},
		{del("x", "a", 1), ""},
		{upsert("x", "a", 1, ` {"a":1}`), ""},
	}
	for _, c := range cases {
		got := checkEvent(&c.e, false)
		if (c.want == "") != (got == "") || !strings.HasPrefix(got, c.want) {
			t.Errorf("%+v: got %q, want %q", c.e, got, c.want)
		}
	}
	// Documents PostgreSQL validated are not parsed again, but must still
	// be objects.
	for doc, want := range map[string]string{`{"a":1}`: "", ` {"a":1}`: "", `[]`: "document: must be a JSON object", ``: "document: must be a JSON object"} {
		e := upsert("x", "a", 1, doc)
		if got := checkEvent(&e, true); got != want {
			t.Errorf("valid JSON %q: got %q, want %q", doc, got, want)
		}
	}
}

// The sink is what the relay engine writes to.
var _ relay.Sink = (*Sink)(nil)
