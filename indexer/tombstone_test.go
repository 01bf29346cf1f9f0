package indexer

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/outbox"
)

func TestPurgeTombstones(t *testing.T) {
	t.Parallel()

	t.Run("only tombstones older than the horizon are purged", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		ctx := context.Background()
		// Tombstones written "two hours ago" by a sink whose clock is set back.
		s.now = func() time.Time { return time.Now().Add(-2 * time.Hour) }
		mustWrite(t, s, upsert(name, "live", 1, `{}`), del(name, "old1", 3), del(name, "old2", 4), del(name, "back", 2))
		s.now = time.Now
		mustWrite(t, s, del(name, "fresh", 7), upsert(name, "back", 5, `{"back":true}`))
		refresh(t, es, name)

		purged, err := PurgeTombstones(ctx, es, name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if purged != 2 {
			t.Fatalf("purged %d, want 2 (old1, old2)", purged)
		}
		for id, found := range map[string]bool{"old1": false, "old2": false, "fresh": true, "live": true, "back": true} {
			if d := getDoc(t, es, name, id); d.Found != found {
				t.Errorf("%s: found %v, want %v", id, d.Found, found)
			}
		}
		if d := getDoc(t, es, name, "fresh"); !isTombstone(d.Source) {
			t.Errorf("fresh tombstone changed: %s", d.Source)
		}
		refresh(t, es, name)
		if purged, err := PurgeTombstones(ctx, es, name, time.Hour); err != nil || purged != 0 {
			t.Fatalf("second purge: %d %v", purged, err)
		}
	})

	t.Run("a tombstone re-upserted after the search is never deleted, even at its own version", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		mustWrite(t, s, del(name, "a", 5), del(name, "b", 5), del(name, "c", 5))
		// The search saw the three tombstones; then "a" came back at a
		// higher version and "c" at the tombstone's own version (a
		// producer reusing a version: the later write wins).
		hits := []tombstoneHit{seen(t, es, name, "a"), seen(t, es, name, "b"), seen(t, es, name, "c")}
		mustWrite(t, s, upsert(name, "a", 6, `{"v":6}`))
		if got := statuses(mustWrite(t, s, upsert(name, "c", 5, `{"v":5}`))); got != "applied" {
			t.Fatalf("same-version upsert over the tombstone: %s", got)
		}
		n, err := deleteTombstones(context.Background(), es, hits)
		if err != nil || n != 1 {
			t.Fatalf("deleted %d, %v; want 1", n, err)
		}
		if d := getDoc(t, es, name, "a"); !d.Found || d.Version != 6 {
			t.Fatalf("re-upserted document lost: %+v", d)
		}
		if d := getDoc(t, es, name, "c"); !d.Found || isTombstone(d.Source) {
			t.Fatalf("document written at the tombstone's version was purged: %+v", d)
		}
		if d := getDoc(t, es, name, "b"); d.Found {
			t.Fatalf("tombstone b not purged")
		}
	})

	t.Run("purging pages through more tombstones than one page", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		events := make([]outbox.Event, 0, purgePage+150)
		for i := range purgePage + 150 {
			events = append(events, del(name, "t"+strconv.Itoa(i), 1))
		}
		mustWrite(t, s, events...)
		refresh(t, es, name)
		n, err := PurgeTombstones(context.Background(), es, name, 0)
		if err != nil || n != purgePage+150 {
			t.Fatalf("purged %d, %v", n, err)
		}
	})

	t.Run("a bad horizon or name is refused", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		if _, err := PurgeTombstones(context.Background(), es, name, -time.Second); err == nil {
			t.Fatal("negative horizon accepted")
		}
		if _, err := PurgeTombstones(context.Background(), es, "", time.Second); err == nil {
			t.Fatal("empty name accepted")
		}
	})
}

func TestPing(t *testing.T) {
	t.Parallel()
	es, _ := setup(t)
	if err := Ping(context.Background(), es); err != nil {
		t.Fatal(err)
	}
	dead := client(t, "http://127.0.0.1:1")
	if err := Ping(context.Background(), dead); err == nil {
		t.Fatal("ping of a dead address succeeded")
	}
}

// seen is a tombstone as the purge's search reports it.
func seen(t *testing.T, es *elasticsearch.Client, name, id string) tombstoneHit {
	t.Helper()
	st, b := esCall(t, es, "GET", "/"+name+"/_doc/"+id, "")
	if st != 200 {
		t.Fatalf("get %s: %d %s", id, st, b)
	}
	var h tombstoneHit
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	return h
}
