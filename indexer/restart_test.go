//go:build restart

// These tests stop and start the test Elasticsearch itself, so they run on
// their own, after the main suite (`make test` does this; by hand:
// go test -tags restart -run TestRestart ./indexer/). They need the
// servers that scripts/services manages.

package indexer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

func services(t *testing.T, cmd string) {
	t.Helper()
	c := exec.Command("../scripts/services", cmd)
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	start := time.Now()
	if err := c.Run(); err != nil {
		t.Fatalf("scripts/services %s: %v", cmd, err)
	}
	t.Logf("scripts/services %s took %s", cmd, time.Since(start).Round(time.Second))
}

func waitHealthy(t *testing.T, es *elasticsearch.Client) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := Ping(ctx, es)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Elasticsearch not back: %v", err)
		}
		time.Sleep(time.Second)
	}
}

func TestRestartResurrection(t *testing.T) {
	es, name := setup(t)
	spec := []byte(`{"settings":{"index":{"gc_deletes":"1s","number_of_replicas":0}}}`)
	s := newSink(t, Options{Client: es, IndexSpec: spec})

	t.Run("a delete survives an Elasticsearch restart and an older upsert stays invisible", func(t *testing.T) {
		if got := statuses(mustWrite(t, s, upsert(name, "doc", 1, docN(1)))); got != "applied" {
			t.Fatalf("v1: %s", got)
		}
		if got := statuses(mustWrite(t, s, del(name, "doc", 5))); got != "applied" {
			t.Fatalf("delete v5: %s", got)
		}
		time.Sleep(1500 * time.Millisecond) // past gc_deletes
		services(t, "restart-es")
		waitHealthy(t, es)
		after := newSink(t, Options{Client: es, IndexSpec: spec}) // a fresh process's view
		var got string
		deadline := time.Now().Add(2 * time.Minute)
		for {
			// Right after a restart the shard may still be recovering.
			got = statuses(mustWrite(t, after, upsert(name, "doc", 3, docN(3))))
			if got != "retry" || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second)
		}
		if got != "stale" {
			t.Fatalf("upsert v3 after restart: %s, want stale", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 0 {
			t.Fatalf("the deleted document came back: %s", docs["doc"])
		}
		if d := getDoc(t, es, name, "doc"); !isTombstone(d.Source) || d.Version != 5 {
			t.Fatalf("GET = version %d %s, want the v5 tombstone", d.Version, d.Source)
		}
		if got := statuses(mustWrite(t, after, upsert(name, "doc", 6, docN(6)))); got != "applied" {
			t.Fatalf("upsert v6: %s", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 1 {
			t.Fatalf("v6 is not visible: %v", docs)
		}
	})
}

func TestRestartMidDrain(t *testing.T) {
	es, name := setup(t)
	pool, schemaName := schematest.Setup(t)
	ob, err := outbox.NewOutbox(schemaName)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const sources, rounds = 1000, 4
	var events []outbox.Event
	for v := int64(1); v <= rounds; v++ {
		for i := range sources {
			e := outbox.Event{IndexName: name, SourceID: fmt.Sprintf("s%03d", i), Version: v, Op: outbox.OpUpsert, Document: json.RawMessage(docN(v))}
			if v == rounds && i%5 == 0 {
				e = outbox.Event{IndexName: name, SourceID: e.SourceID, Version: v, Op: outbox.OpDelete}
			}
			events = append(events, e)
		}
	}
	if _, err := ob.AppendBatch(ctx, pool, events); err != nil {
		t.Fatal(err)
	}
	sink := newSink(t, Options{Client: es, MaxBatchDocs: 50, Workers: 2})
	r, err := relay.New(relay.Config{
		Pool: pool, Schema: schemaName, Sink: sink, MaxBatchDocs: 100,
		BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second,
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	t.Run("Elasticsearch stopped in the middle of a drain: everything arrives once it is back", func(t *testing.T) {
		backlog := func() int64 {
			st, err := relay.CollectStats(ctx, pool, schemaName)
			if err != nil {
				t.Fatal(err)
			}
			return st.Backlog()
		}
		// Stop it once some, not all, events are acknowledged. Before the
		// relay registers its stream the backlog reads 0, hence the bounds.
		waitUntil := time.Now().Add(2 * time.Minute)
		for n := backlog(); n == 0 || n == int64(len(events)); n = backlog() {
			if time.Now().After(waitUntil) {
				t.Fatal("never saw the drain under way (it finished, or never started)")
			}
			time.Sleep(5 * time.Millisecond)
		}
		services(t, "stop-es")
		mid := backlog()
		t.Logf("stopped Elasticsearch with %d of %d events still to deliver", mid, len(events))
		if mid == 0 {
			t.Fatal("the drain finished before Elasticsearch stopped; the test proves nothing")
		}
		time.Sleep(3 * time.Second)
		services(t, "start-es")
		waitHealthy(t, es)
		deadline := time.Now().Add(3 * time.Minute)
		for backlog() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("backlog still %d three minutes after Elasticsearch came back", backlog())
			}
			time.Sleep(100 * time.Millisecond)
		}
		var dead int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+schemaName+`".dead_letters`).Scan(&dead); err != nil {
			t.Fatal(err)
		}
		if dead != 0 {
			t.Fatalf("%d events dead-lettered by an outage", dead)
		}
		docs := searchRead(t, es, name)
		if want := sources - sources/5; len(docs) != want {
			t.Fatalf("read alias has %d documents, want %d", len(docs), want)
		}
		for i := range sources {
			id := fmt.Sprintf("s%03d", i)
			d := getDoc(t, es, name, id)
			if d.Version != rounds {
				t.Fatalf("%s at version %d, want %d", id, d.Version, rounds)
			}
			if (i%5 == 0) != isTombstone(d.Source) {
				t.Fatalf("%s: tombstone=%v, want %v", id, isTombstone(d.Source), i%5 == 0)
			}
		}
	})
}
