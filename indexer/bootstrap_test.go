package indexer

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

func TestBootstrap(t *testing.T) {
	t.Parallel()

	t.Run("bootstrap run concurrently and again creates the index and its three aliases once", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = Bootstrap(ctx, es, name, nil) }()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("bootstrap %d: %v", i, err)
			}
		}
		if err := Bootstrap(ctx, es, name, nil); err != nil {
			t.Fatalf("again: %v", err)
		}
		st, b := esCall(t, es, "GET", "/_alias/"+name+","+WriteAlias(name)+","+ReadAlias(name), "")
		if st != 200 {
			t.Fatalf("aliases: %d %s", st, b)
		}
		var got map[string]struct {
			Aliases map[string]json.RawMessage `json:"aliases"`
		}
		_ = json.Unmarshal(b, &got)
		if len(got) != 1 || len(got[FirstIndex(name)].Aliases) != 3 {
			t.Fatalf("aliases: %s", b)
		}
		st, b = esCall(t, es, "GET", "/"+FirstIndex(name)+"/_mapping", "")
		if st != 200 || !strings.Contains(string(b), `"outboxd_deleted":{"type":"boolean"}`) || !strings.Contains(string(b), `"outboxd_deleted_at":{"type":"date"}`) {
			t.Fatalf("mapping: %s", b)
		}
	})

	t.Run("a concrete index with the alias name is refused and left untouched", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		if st, b := esCall(t, es, "PUT", "/"+name+"/_doc/keep?refresh=true", `{"precious":true}`); st != 201 {
			t.Fatalf("seed: %d %s", st, b)
		}
		err := Bootstrap(context.Background(), es, name, nil)
		if !IsIncompatible(err) || !strings.Contains(err.Error(), "concrete index") {
			t.Fatalf("got %v", err)
		}
		s := newSink(t, Options{Client: es})
		out := mustWrite(t, s, upsert(name, "a", 1, `{}`), del(name, "keep", 9))
		for _, o := range out {
			if o.Status != outbox.Rejected || !strings.Contains(o.Reason, "concrete index") {
				t.Fatalf("got %+v", out)
			}
		}
		if d := getDoc(t, es, name, "keep"); !d.Found || string(d.Source) != `{"precious":true}` {
			t.Fatalf("user data changed: %+v", d)
		}
		if st, _ := esCall(t, es, "HEAD", "/"+FirstIndex(name), ""); st != 404 {
			t.Fatalf("%s was created: %d", FirstIndex(name), st)
		}
	})

	t.Run("a read alias without the tombstone filter is refused", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		body := `{"aliases":{"` + name + `":{"is_write_index":true},"` + ReadAlias(name) + `":{}}}`
		if st, b := esCall(t, es, "PUT", "/"+FirstIndex(name), body); st != 200 {
			t.Fatalf("create: %d %s", st, b)
		}
		err := Bootstrap(context.Background(), es, name, nil)
		if !IsIncompatible(err) || !strings.Contains(err.Error(), "filter") {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("an index made by hand without aliases is adopted", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		if st, b := esCall(t, es, "PUT", "/"+FirstIndex(name), `{"settings":{"number_of_replicas":0}}`); st != 200 {
			t.Fatalf("create: %d %s", st, b)
		}
		if err := Bootstrap(context.Background(), es, name, nil); err != nil {
			t.Fatal(err)
		}
		s := newSink(t, Options{Client: es})
		if got := statuses(mustWrite(t, s, upsert(name, "a", 1, `{}`), del(name, "b", 1))); got != "applied applied" {
			t.Fatalf("got %s", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 1 {
			t.Fatalf("read alias %v", docs)
		}
	})

	t.Run("a missing write alias is recreated instead of auto-creating an index", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		mustWrite(t, s, upsert(name, "a", 1, `{}`))
		if st, b := esCall(t, es, "DELETE", "/"+FirstIndex(name)+"/_alias/"+WriteAlias(name), ""); st != 200 {
			t.Fatalf("remove alias: %d %s", st, b)
		}
		out := mustWrite(t, s, upsert(name, "b", 1, `{}`))
		if out[0].Status != outbox.Retry || !strings.Contains(out[0].Reason, "write alias missing") {
			t.Fatalf("got %+v", out)
		}
		if got := statuses(mustWrite(t, s, upsert(name, "b", 1, `{}`))); got != "applied" {
			t.Fatalf("after re-bootstrap: %s", got)
		}
		if st, _ := esCall(t, es, "GET", "/_alias/"+WriteAlias(name), ""); st != 200 {
			t.Fatalf("alias not recreated: %d", st)
		}
	})

	t.Run("a name that is another index's read alias or concrete index is refused and nothing is written", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		mustWrite(t, s, upsert(name, "1", 1, `{"owner":"x"}`))
		for _, derived := range []string{ReadAlias(name), FirstIndex(name), name + "-write"} {
			err := Bootstrap(context.Background(), es, derived, nil)
			var ne *NameError
			if !errors.As(err, &ne) || !strings.Contains(err.Error(), "reserves") || !strings.Contains(err.Error(), `index "`+name+`"`) {
				t.Errorf("bootstrap %s: %v, want a NameError naming %s", derived, err, name)
			}
			out := mustWrite(t, s, upsert(derived, "1", 5, `{"owner":"intruder"}`))
			if out[0].Status != outbox.Rejected || !strings.Contains(out[0].Reason, "index_name") {
				t.Errorf("write to %s: %+v, want rejected", derived, out)
			}
		}
		if d := getDoc(t, es, name, "1"); string(d.Source) != `{"owner":"x"}` {
			t.Fatalf("%s/_doc/1 is now %s", name, d.Source)
		}
	})

	t.Run("an alias that already points at another outboxd index is refused naming both", func(t *testing.T) {
		t.Parallel()
		es, owner := setup(t)
		if err := Bootstrap(context.Background(), es, owner, nil); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ what, alias string }{
			{"write alias", "w"},
			{"read alias", "r"},
		} {
			_, name := setup(t)
			alias := name
			if c.alias == "r" {
				alias = ReadAlias(name)
			}
			if st, b := esCall(t, es, "PUT", "/"+FirstIndex(owner)+"/_alias/"+alias, ""); st != 200 {
				t.Fatalf("%s: add alias: %d %s", c.what, st, b)
			}
			err := Bootstrap(context.Background(), es, name, nil)
			if !IsIncompatible(err) || !strings.Contains(err.Error(), alias+" already points at "+FirstIndex(owner)) || !strings.Contains(err.Error(), `outboxd index "`+owner+`"`) {
				t.Errorf("%s: got %v, want a refusal naming %s and %s", c.what, err, alias, owner)
			}
			if st, _ := esCall(t, es, "HEAD", "/"+FirstIndex(name), ""); st != 404 {
				t.Errorf("%s: %s was created: %d", c.what, FirstIndex(name), st)
			}
		}
		// A bootstrapped index whose read alias was also added to owner's index.
		_, name := setup(t)
		if err := Bootstrap(context.Background(), es, name, nil); err != nil {
			t.Fatal(err)
		}
		if st, b := esCall(t, es, "PUT", "/"+FirstIndex(owner)+"/_alias/"+ReadAlias(name), ""); st != 200 {
			t.Fatalf("add alias: %d %s", st, b)
		}
		err := Bootstrap(context.Background(), es, name, nil)
		if !IsIncompatible(err) || !strings.Contains(err.Error(), ReadAlias(name)+" already points at "+FirstIndex(owner)) {
			t.Errorf("a read alias spanning two indexes: got %v, want a refusal naming %s", err, FirstIndex(owner))
		}
		st, b := esCall(t, es, "GET", "/"+FirstIndex(owner)+"/_alias", "")
		if st != 200 || strings.Count(string(b), `-read"`) != 3 {
			t.Fatalf("aliases of %s changed by the refused bootstraps: %s", FirstIndex(owner), b)
		}
	})

	t.Run("every name bootstrap derives is reserved", func(t *testing.T) {
		for _, n := range []string{FirstIndex("x"), ReadAlias("x")} {
			if outbox.ReservedSuffix(n) == "" {
				t.Errorf("%s is derived by bootstrap but not in relay's reserved suffixes", n)
			}
		}
	})

	t.Run("an invalid index name is rejected with the reason", func(t *testing.T) {
		t.Parallel()
		es, _ := setup(t)
		s := newSink(t, Options{Client: es})
		out := mustWrite(t, s, upsert("Bad Name", "a", 1, `{}`))
		if out[0].Status != outbox.Rejected || !strings.Contains(out[0].Reason, "index_name") {
			t.Fatalf("got %+v", out)
		}
	})
}

func TestIndexBody(t *testing.T) {
	t.Parallel()

	t.Run("defaults are single-node friendly and carry the outboxd fields", func(t *testing.T) {
		b, err := indexBody(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"number_of_replicas":0`, `"number_of_shards":1`, `"dynamic":true`, `"outboxd_deleted":{"type":"boolean"}`, `"outboxd_deleted_at":{"type":"date"}`} {
			if !strings.Contains(string(b), want) {
				t.Errorf("%s lacks %s", b, want)
			}
		}
	})

	t.Run("a user spec keeps its settings and mappings and gains the outboxd fields", func(t *testing.T) {
		b, err := indexBody([]byte(`{"settings":{"number_of_shards":3},"mappings":{"dynamic":"strict","properties":{"title":{"type":"text"}}}}`))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"number_of_shards":3`, `"dynamic":"strict"`, `"title":{"type":"text"}`, `"outboxd_deleted":{"type":"boolean"}`} {
			if !strings.Contains(string(b), want) {
				t.Errorf("%s lacks %s", b, want)
			}
		}
	})

	t.Run("bad specs name the field", func(t *testing.T) {
		for spec, want := range map[string]string{
			`[]`:             "index spec: must be a JSON object",
			`{"aliases":{}}`: "aliases: outboxd owns the aliases",
			`{"sttings":{}}`: "sttings: unknown key",
			`{"mappings":{"properties":{"outboxd_deleted":{"type":"keyword"}}}}`: "mappings.properties.outboxd_deleted",
			`{"mappings":[]}`: "mappings: must be a JSON object",
		} {
			if _, err := indexBody([]byte(spec)); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: got %v, want %q", spec, err, want)
			}
		}
	})
}
