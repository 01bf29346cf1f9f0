package indexer

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/elastic/go-elasticsearch/v8"
)

// oldLayout builds by hand the layout of releases before N-write: N the
// unfiltered write alias and N-read the filtered one, holding documents
// a (v1), b (v2) and the tombstone of c (v3).
func oldLayout(t *testing.T, es *elasticsearch.Client, name string) {
	t.Helper()
	body := `{"settings":{"number_of_replicas":0},"mappings":{"properties":{"outboxd_deleted":{"type":"boolean"},"outboxd_deleted_at":{"type":"date"}}},` +
		`"aliases":{"` + name + `":{"is_write_index":true},"` + ReadAlias(name) + `":{"filter":` + ReadFilter + `}}}`
	if st, b := esCall(t, es, "PUT", "/"+FirstIndex(name), body); st != 200 {
		t.Fatalf("create old layout: %d %s", st, b)
	}
	for i, d := range []string{`{"title":"a"}`, `{"title":"b"}`, `{"outboxd_deleted":true,"outboxd_deleted_at":"2026-01-01T00:00:00.000Z"}`} {
		id, v := string(rune('a'+i)), i+1
		if st, b := esCall(t, es, "PUT", fmt.Sprintf("/%s/_doc/%s?version=%d&version_type=external&require_alias=true", name, id, v), d); st != 201 {
			t.Fatalf("seed %s: %d %s", id, st, b)
		}
	}
	refresh(t, es, name)
}

const tombstoneQuery = `{"query":{"term":{"outboxd_deleted":true}}}`

func TestLayout(t *testing.T) {
	t.Parallel()

	t.Run("the plain name never returns or counts a tombstone, whatever the search API", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		mustWrite(t, s, upsert(name, "a", 1, `{"k":"x"}`), upsert(name, "b", 1, `{"k":"x"}`), upsert(name, "c", 1, `{"k":"y"}`))
		mustWrite(t, s, del(name, "b", 2), del(name, "c", 2))
		refresh(t, es, name)

		if n := countOf(t, es, WriteAlias(name), `{"query":{"match_all":{}}}`); n != 3 {
			t.Fatalf("%s holds %d documents, want 3 (1 live, 2 tombstones)", WriteAlias(name), n)
		}
		if n := countOf(t, es, name, `{"query":{"match_all":{}}}`); n != 1 {
			t.Fatalf("_count on %s = %d, want 1", name, n)
		}
		if n := countOf(t, es, name, tombstoneQuery); n != 0 {
			t.Fatalf("%s counts %d tombstones", name, n)
		}
		if docs := searchRead(t, es, name); len(docs) != 1 || docs["a"] == nil {
			t.Fatalf("match_all on %s: %v", name, docs)
		}
		st, b := esCall(t, es, "POST", "/"+name+"/_search", `{"size":0,"aggs":{"k":{"terms":{"field":"k.keyword"}},"del":{"terms":{"field":"outboxd_deleted"}}}}`)
		if st != 200 || !strings.Contains(string(b), `"k":{"doc_count_error_upper_bound":0,"sum_other_doc_count":0,"buckets":[{"key":"x","doc_count":1}]}`) || !strings.Contains(string(b), `"del":{"doc_count_error_upper_bound":0,"sum_other_doc_count":0,"buckets":[]}`) {
			t.Fatalf("aggregations on %s: %d %s", name, st, b)
		}
		st, b = esCall(t, es, "POST", "/_msearch", "{\"index\":\""+name+"\"}\n{\"query\":{\"match_all\":{}}}\n{\"index\":\""+name+"\"}\n"+tombstoneQuery+"\n")
		if st != 200 || strings.Count(string(b), `"total":{"value":1,`) != 1 || strings.Count(string(b), `"total":{"value":0,`) != 1 {
			t.Fatalf("_msearch on %s: %d %s", name, st, b)
		}
		// OpenSearch opens a point in time under another path and names its id pit_id.
		pitPath := "/" + name + "/_pit?keep_alive=1m"
		if openSearch(t, es) {
			pitPath = "/" + name + "/_search/point_in_time?keep_alive=1m"
		}
		st, b = esCall(t, es, "POST", pitPath, "")
		var pit struct {
			ID    string `json:"id"`
			PitID string `json:"pit_id"`
		}
		if json.Unmarshal(b, &pit) == nil && pit.ID == "" {
			pit.ID = pit.PitID
		}
		if st != 200 || pit.ID == "" {
			t.Fatalf("open point in time on %s: %d %s", name, st, b)
		}
		st, b = esCall(t, es, "POST", "/_search", `{"size":100,"pit":{"id":"`+pit.ID+`"},"query":{"match_all":{}}}`)
		if st != 200 || !strings.Contains(string(b), `"total":{"value":1,`) || strings.Contains(string(b), "outboxd_deleted") {
			t.Fatalf("point in time search on %s: %d %s", name, st, b)
		}
		st, b = esCall(t, es, "POST", "/"+name+"/_search?scroll=1m", `{"size":1,"query":{"match_all":{}}}`)
		if st != 200 || !strings.Contains(string(b), `"total":{"value":1,`) || strings.Contains(string(b), "outboxd_deleted\":true") {
			t.Fatalf("scroll on %s: %d %s", name, st, b)
		}
	})

	t.Run("GET by id on the plain name returns the tombstone of a deleted document, never its old content", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		mustWrite(t, s, upsert(name, "a", 1, `{"secret":"old"}`))
		mustWrite(t, s, del(name, "a", 2))
		d := getDoc(t, es, name, "a")
		if !d.Found || d.Version != 2 || !isTombstone(d.Source) || strings.Contains(string(d.Source), "old") {
			t.Fatalf("GET %s/_doc/a = %+v", name, d)
		}
	})

	upgrade := map[string]func(t *testing.T, es *elasticsearch.Client, name string){
		"bootstrap (the relay's next start or first write)": func(t *testing.T, es *elasticsearch.Client, name string) {
			if err := Bootstrap(context.Background(), es, name, nil); err != nil {
				t.Fatal(err)
			}
		},
		"MigrateLayout (outboxd migrate-index)": func(t *testing.T, es *elasticsearch.Client, name string) {
			changed, err := MigrateLayout(context.Background(), es, name)
			if err != nil || !changed {
				t.Fatalf("MigrateLayout = %v, %v; want true, nil", changed, err)
			}
			if changed, err := MigrateLayout(context.Background(), es, name); err != nil || changed {
				t.Fatalf("MigrateLayout again = %v, %v; want false, nil", changed, err)
			}
		},
	}
	for how, do := range upgrade {
		t.Run("the layout of older releases is upgraded in place by "+how+": no document copied, the name never missing, clean from then on", func(t *testing.T) {
			t.Parallel()
			es, name := setup(t)
			oldLayout(t, es, name)
			if n := countOf(t, es, name, tombstoneQuery); n != 1 {
				_, aliases := esCall(t, es, "GET", "/"+FirstIndex(name)+"/_alias", "")
				_, docs := esCall(t, es, "POST", "/"+FirstIndex(name)+"/_search?version=true", `{"size":10}`)
				// Aliases of the current layout here mean someone else upgraded
				// it: a relay that another test started on this server without
				// --indexes or --upgrade-layouts=false.
				t.Fatalf("old layout: %s shows %d tombstones, want 1; aliases %s; documents %s", name, n, aliases, docs)
			}
			before := getDoc(t, es, FirstIndex(name), "a")

			// A searcher polls the name throughout; from the moment the
			// upgrade returns it must never see a tombstone. It polls at
			// least once before the upgrade and five times after it,
			// counted, however slow the machine.
			const pollsAfter = 5
			var upgraded atomic.Bool
			var failed, dirty, polls, seenAfter atomic.Int64
			polled := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seenAfter.Load() < pollsAfter {
					up := upgraded.Load()
					st, b := esCall(t, es, "POST", "/"+name+"/_count", tombstoneQuery)
					if polls.Add(1) == 1 {
						close(polled)
					}
					var r struct{ Count int }
					if st != 200 || json.Unmarshal(b, &r) != nil {
						failed.Add(1)
					} else if up && r.Count != 0 {
						dirty.Add(1)
					}
					if up {
						seenAfter.Add(1)
					}
				}
			}()
			<-polled
			do(t, es, name)
			upgraded.Store(true)
			wg.Wait()
			if failed.Load() != 0 || dirty.Load() != 0 {
				t.Fatalf("searcher on %s: %d polls, %d failed, %d saw a tombstone after the upgrade", name, polls.Load(), failed.Load(), dirty.Load())
			}
			after := getDoc(t, es, FirstIndex(name), "a")
			if after.Version != before.Version || string(after.Source) != string(before.Source) {
				t.Fatalf("document a changed: %+v -> %+v", before, after)
			}
			st, b := esCall(t, es, "GET", "/_cat/indices/"+name+"*?h=index", "")
			if st != 200 || strings.TrimSpace(string(b)) != FirstIndex(name) {
				t.Fatalf("indices behind %s: %d %q; want only %s (nothing copied)", name, st, b, FirstIndex(name))
			}
			if n := countOf(t, es, WriteAlias(name), `{"query":{"match_all":{}}}`); n != 3 {
				t.Fatalf("%s holds %d documents, want 3", WriteAlias(name), n)
			}

			// The sink writes through N-write; a relay of an older release
			// writing through N (require_alias) keeps working meanwhile.
			s := newSink(t, Options{Client: es})
			if got := statuses(mustWrite(t, s, upsert(name, "a", 5, `{"title":"a5"}`), del(name, "b", 4), upsert(name, "c", 2, `{"title":"stale"}`))); got != "applied applied stale" {
				t.Fatalf("writes after the upgrade: %s", got)
			}
			if st, b := esCall(t, es, "PUT", "/"+name+"/_doc/d?version=1&version_type=external&require_alias=true", `{"title":"d"}`); st != 201 {
				t.Fatalf("write through %s by an older relay: %d %s", name, st, b)
			}
			docs := searchRead(t, es, name)
			if len(docs) != 2 || !strings.Contains(string(docs["a"]), "a5") || docs["d"] == nil {
				t.Fatalf("search on %s after the upgrade: %v", name, docs)
			}
			if n, err := PurgeTombstones(context.Background(), es, name, 0); err != nil || n != 2 {
				t.Fatalf("purge after the upgrade = %d, %v; want 2 tombstones purged", n, err)
			}
		})
	}

	t.Run("migrating a name with nothing behind it fails and creates nothing", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		if _, err := MigrateLayout(context.Background(), es, name); err == nil || !strings.Contains(err.Error(), "no index or alias") {
			t.Fatalf("got %v", err)
		}
		if st, _ := esCall(t, es, "HEAD", "/"+FirstIndex(name), ""); st != 404 {
			t.Fatalf("%s was created: %d", FirstIndex(name), st)
		}
	})

	t.Run("an alias of the name already pointing at another index is refused, changing nothing", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		other := name + "z"
		t.Cleanup(func() { dropIndices(t, es, other) })
		mustWrite(t, newSink(t, Options{Client: es}), upsert(other, "a", 1, `{}`))
		if st, b := esCall(t, es, "PUT", "/"+FirstIndex(name), `{"aliases":{"`+WriteAlias(name)+`":{"is_write_index":true}}}`); st != 200 {
			t.Fatalf("create: %d %s", st, b)
		}
		if st, b := esCall(t, es, "POST", "/_aliases", `{"actions":[{"add":{"index":"`+FirstIndex(other)+`","alias":"`+ReadAlias(name)+`"}}]}`); st != 200 {
			t.Fatalf("alias: %d %s", st, b)
		}
		err := Bootstrap(context.Background(), es, name, nil)
		if !IsIncompatible(err) || !strings.Contains(err.Error(), FirstIndex(other)) {
			t.Fatalf("got %v", err)
		}
		if st, _ := esCall(t, es, "GET", "/_alias/"+name, ""); st != 404 {
			t.Fatalf("%s was created by a refused bootstrap: %d", name, st)
		}
	})
}

func TestBootstrapAfterASwap(t *testing.T) {
	t.Parallel()

	t.Run("a bootstrap that found the old index behind the write alias just before a swap looks again instead of putting the names back on it", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		ctx := context.Background()
		s := newSink(t, Options{Client: es})
		mustWrite(t, s, upsert(name, "a", 1, `{}`))
		second := name + "-000002"
		t.Cleanup(func() { esCall(t, es, "DELETE", "/"+second, "") })
		if st, b := esCall(t, es, "PUT", "/"+second, `{"settings":{"number_of_replicas":0}}`); st != 200 {
			t.Fatalf("create %s: %d %s", second, st, b)
		}
		// What outboxd rebuild's swap does, in one atomic request.
		swap := `{"actions":[`
		for i, a := range []string{name, WriteAlias(name), ReadAlias(name)} {
			def := `,"filter":` + ReadFilter
			if a == WriteAlias(name) {
				def = `,"is_write_index":true`
			}
			if i > 0 {
				swap += ","
			}
			swap += `{"remove":{"index":"` + FirstIndex(name) + `","alias":"` + a + `"}},{"add":{"index":"` + second + `","alias":"` + a + `"` + def + `}}`
		}
		if st, b := esCall(t, es, "POST", "/_aliases", swap+`]}`); st != 200 {
			t.Fatalf("swap: %d %s", st, b)
		}
		// A relay that resolved N-write to the old index just before the
		// swap and reads the old index's aliases just after.
		done, err := checkAliases(ctx, es, name, FirstIndex(name), true)
		if err != nil || done {
			t.Fatalf("checkAliases = %v, %v; want it to look again", done, err)
		}
		st, b := esCall(t, es, "GET", "/"+FirstIndex(name)+"/_alias", "")
		if st != 200 || strings.Contains(string(b), WriteAlias(name)) {
			t.Fatalf("the old index got its aliases back: %d %s", st, b)
		}
		if err := Bootstrap(ctx, es, name, nil); err != nil {
			t.Fatal(err)
		}
		if got := statuses(mustWrite(t, s, upsert(name, "b", 1, `{}`))); got != "applied" {
			t.Fatalf("write after the swap: %s", got)
		}
		if d := getDoc(t, es, second, "b"); !d.Found {
			t.Fatalf("the write did not reach %s", second)
		}
	})
}
