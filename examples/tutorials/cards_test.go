package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// cardsEnv is an indexEnv with the cards index declared, and the sink the
// relay would use for it: the documents sink in front of the indexer's.
type cardsEnv struct {
	*indexEnv
	cards string
	docs  *documents.Sink
}

func setupCards(t *testing.T) *cardsEnv {
	t.Helper()
	cards := schematest.Name("cards-")
	e := setupIndex(t, func(c *Config) { c.CardsIndex = cards })
	t.Cleanup(func() {
		res, err := e.es.Indices.Delete([]string{indexer.FirstIndex(cards)}, e.es.Indices.Delete.WithIgnoreUnavailable(true))
		if err == nil {
			res.Body.Close()
		}
	})
	ctx := context.Background()
	for range 2 { // declared again at every start: the second changes nothing
		if err := DeclareCards(ctx, e.pool, e.tables, e.outbox, cards, "test"); err != nil {
			t.Fatal(err)
		}
	}
	docs, err := documents.NewSink(documents.SinkOptions{Pool: e.pool, Schema: e.outbox, Next: e.sink})
	if err != nil {
		t.Fatal(err)
	}
	return &cardsEnv{indexEnv: e, cards: cards, docs: docs}
}

// deliverAll writes every event of the outbox through the documents sink,
// as the relay does.
func (e *cardsEnv) deliverAll(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := e.docs.Write(ctx, e.outboxEvents(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out {
		if o.Status == outbox.Rejected || o.Status == outbox.Retry {
			t.Fatalf("delivery: %s: %s", o.Status, o.Reason)
		}
	}
	res, err := e.es.Indices.Refresh(e.es.Indices.Refresh.WithIndex(e.cards))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
}

// authors reads GET /api/authors/{id}/tutorials as id -> author name.
func (e *cardsEnv) authors(t *testing.T, id string) map[string]string {
	t.Helper()
	r := e.do(t, "GET", "/api/authors/"+id+"/tutorials", "", "", "")
	if r.status != http.StatusOK {
		t.Fatalf("author's cards: %d %s", r.status, r.body)
	}
	var got AuthorCards
	r.json(t, &got)
	out := map[string]string{}
	for _, c := range got.Cards {
		out[c.ID] = c.Author
	}
	return out
}

// README, "Documents from several tables": renaming an author is one write
// to the authors table, and the cards of all that author's tutorials
// follow; a deleted tutorial's card goes.
func TestCards(t *testing.T) {
	t.Parallel()
	e := setupCards(t)
	var ann []Tutorial
	for i, key := range []string{"k1", "k2", "k3"} {
		ann = append(ann, e.create(t, "ann", key, `{"title":"ann `+string(rune('a'+i))+`"}`))
	}
	bob := e.create(t, "bob", "k4", `{"title":"bob's"}`)
	if r := e.do(t, "PUT", "/api/authors/ann", "bob", "k5", `{"name":"Bob"}`); r.status != http.StatusForbidden {
		t.Fatalf("naming another author: %d %s", r.status, r.body)
	}
	if r := e.do(t, "PUT", "/api/authors/ann", "ann", "k6", `{"name":"Ann"}`); r.status != http.StatusOK {
		t.Fatalf("name: %d %s", r.status, r.body)
	}
	e.deliverAll(t)
	want := map[string]string{ann[0].ID: "Ann", ann[1].ID: "Ann", ann[2].ID: "Ann"}
	if got := e.authors(t, "ann"); !equal(got, want) {
		t.Fatalf("ann's cards %v, want %v", got, want)
	}
	before := e.events(t)
	if r := e.do(t, "PUT", "/api/authors/ann", "ann", "k7", `{"name":"Ann Smith"}`); r.status != http.StatusOK {
		t.Fatalf("rename: %d %s", r.status, r.body)
	}
	if n := e.events(t) - before; n != 2 {
		t.Fatalf("the rename appended %d events; want the watch's 2 (the old row and the new), none by the service", n)
	}
	e.do(t, "DELETE", "/api/tutorials/"+ann[2].ID, "ann", "k8", "")
	e.deliverAll(t)
	want = map[string]string{ann[0].ID: "Ann Smith", ann[1].ID: "Ann Smith"}
	if got := e.authors(t, "ann"); !equal(got, want) {
		t.Fatalf("ann's cards after the rename and a delete: %v, want %v", got, want)
	}
	if got := e.authors(t, "bob"); !equal(got, map[string]string{bob.ID: "bob"}) {
		t.Fatalf("bob's cards: %v", got)
	}
}

func equal(a, b map[string]string) bool {
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
