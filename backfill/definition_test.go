package backfill

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// hookSink runs before once, on the first write, then writes through.
type hookSink struct {
	next   *indexer.Sink
	once   sync.Once
	before func()
}

func (h *hookSink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	h.once.Do(h.before)
	return h.next.Write(ctx, events)
}

// readHeldSink signals entered when a write reaches it, and writes through
// once release is closed, keeping the outcomes (the documents sink
// reports stale writes of a refresh as done, like applied ones).
type readHeldSink struct {
	next             *indexer.Sink
	entered, release chan struct{}
	out              []outbox.Outcome
}

func (h *readHeldSink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	close(h.entered)
	<-h.release
	out, err := h.next.Write(ctx, events)
	h.out = out
	return out, err
}

func refresh(index, id string) []outbox.Event {
	return []outbox.Event{{ID: 1, IndexName: index, SourceID: id, Version: 1, Op: outbox.OpRefresh, EventType: "refresh"}}
}

// README, "Documents from several tables": backfill without --source-sql loads
// every document of the definition, resumably, each batch at the version of its
// read, so it loses to a refresh read after it and wins over one read before.
func TestBackfillDefinition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a backfill of a definition interrupted midway and run again, with writers changing the three tables and the relay delivering their refreshes, ends equal to the definition", func(t *testing.T) {
		t.Parallel()
		const tutorials = 20_000
		d := tooltest.NewDocs(t, tutorials)
		stopRelay := d.StartRelay(t)
		wr := d.StartWriters(t, 3, tutorials, 2*time.Millisecond)
		sink := tooltest.NewSink(t, indexer.Options{Client: d.ES, JSONB: true})
		bctx, cancel := context.WithCancel(ctx)
		o := Options{Pool: d.Pool, Schema: d.Schema, Sink: sink, Index: d.Name, Batch: 1000}
		o.afterStore = func(batches int) {
			if batches == 5 {
				cancel()
			}
		}
		first, err := Run(bctx, o)
		cancel()
		if !errors.Is(err, context.Canceled) || first.Rows != 5*1000 {
			t.Fatalf("first run: %+v, %v; want it cancelled after 5 batches of 1000 ids", first, err)
		}
		o.afterStore = nil
		second, err := Run(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if second.From == "" || second.Rows > tutorials-first.Rows+2*1000 {
			t.Fatalf("second run did not continue after the stored id: first %+v, second %+v", first, second)
		}
		wr.Halt()
		if wr.Changes.Load() == 0 {
			t.Fatal("the writers changed nothing")
		}
		d.WaitBacklog(t)
		stopRelay()
		t.Logf("backfill: first run %d ids, second %d after %q (%d applied, %d stale, %.1fs); writers: %d changes",
			first.Rows, second.Rows, second.From, second.Applied, second.Stale, second.Seconds, wr.Changes.Load())
		if dr := d.Drift(t); !dr.Zero() {
			t.Fatalf("index vs definition: %s", dr)
		}
	})

	t.Run("a backfilled document loses to a refresh read after it and an id deleted after the listing becomes a tombstone", func(t *testing.T) {
		t.Parallel()
		d := tooltest.NewDocs(t, 3)
		es := tooltest.NewSink(t, indexer.Options{Client: d.ES, JSONB: true})
		live := d.Sink(t, es)
		// Tutorial 3 is in the index, read before the backfill starts.
		estest.MustWrite(t, live, refresh(d.Name, "3")...)
		sink := &hookSink{next: es, before: func() {
			// The backfill has read tutorial 1 (its first batch): it
			// changes, and the relay reads and writes it first.
			d.Exec(t, `UPDATE {s}.tutorials SET title = 'after the backfill read' WHERE id = 1; DELETE FROM {s}.tutorials WHERE id = 3`)
			estest.MustWrite(t, live, refresh(d.Name, "1")...)
		}}
		rep, err := Run(ctx, Options{Pool: d.Pool, Schema: d.Schema, Sink: sink, Index: d.Name, Batch: 1, InFlight: 1})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Rows != 3 || rep.Stale != 1 || rep.Applied != 2 || rep.Rejected != 0 {
			t.Fatalf("report %+v; want tutorial 1 stale, 2 and 3 applied", rep)
		}
		docs := tooltest.IndexDocs(t, d.ES, d.Name)
		if !strings.Contains(string(docs["1"].Source), "after the backfill read") {
			t.Fatalf("tutorial 1: %s; the backfill overwrote a newer refresh", docs["1"].Source)
		}
		if !docs["3"].Deleted {
			t.Fatalf("tutorial 3: %s; want the tombstone of the backfill's read", docs["3"].Source)
		}
		if dr := d.Drift(t); !dr.Zero() {
			t.Fatalf("index vs definition: %s", dr)
		}
	})

	t.Run("a refresh read before the backfill's read loses to it, though it reaches Elasticsearch later", func(t *testing.T) {
		t.Parallel()
		d := tooltest.NewDocs(t, 2)
		es := tooltest.NewSink(t, indexer.Options{Client: d.ES, JSONB: true})
		held := &readHeldSink{next: es, entered: make(chan struct{}), release: make(chan struct{})}
		live := d.Sink(t, held)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := live.Write(ctx, refresh(d.Name, "1")); err != nil {
				t.Error(err)
			}
		}()
		<-held.entered // read, not yet written
		d.Exec(t, `UPDATE {s}.tutorials SET title = 'newer' WHERE id = 1`)
		rep, err := Run(ctx, Options{Pool: d.Pool, Schema: d.Schema, Sink: es, Index: d.Name})
		if err != nil || rep.Applied != 2 {
			t.Fatalf("backfill: %+v, %v", rep, err)
		}
		close(held.release)
		<-done
		if len(held.out) != 1 || held.out[0].Status != outbox.Stale {
			t.Fatalf("the older refresh's write: %+v; want it stale", held.out)
		}
		if doc := tooltest.IndexDocs(t, d.ES, d.Name)["1"]; !strings.Contains(string(doc.Source), "newer") {
			t.Fatalf("tutorial 1: %s", doc.Source)
		}
	})

	t.Run("what cannot be loaded is refused with the field and the reason", func(t *testing.T) {
		t.Parallel()
		d := tooltest.NewDocs(t, 2)
		sink := tooltest.NewSink(t, indexer.Options{Client: d.ES, JSONB: true})
		pool, bare := schematest.Setup(t)
		for _, c := range []struct {
			name string
			o    Options
			want []string
		}{
			{"no definition and no query", Options{Pool: pool, Schema: bare, Sink: sink, Index: d.Name},
				[]string{"source_sql: required", "no document definition", "documents define"}},
			{"a query for a definition-fed index", Options{Pool: d.Pool, Schema: d.Schema, Sink: sink, Index: d.Name, SourceSQL: d.SQL(`SELECT id, 1, '{}'::jsonb FROM {s}.tutorials`)},
				[]string{"source_sql", "definition-fed", "leave source_sql out"}},
		} {
			if _, err := Run(ctx, c.o); err == nil || !containsAll(err.Error(), c.want) {
				t.Errorf("%s: %v; want %q", c.name, err, c.want)
			}
		}
		noIDs := d.Name + "-noids"
		if _, err := documents.Define(ctx, d.Pool, d.Schema, documents.DefineOptions{Index: noIDs, SQL: d.Definition(), Operator: "test"}); err != nil {
			t.Fatal(err)
		}
		if _, err := Run(ctx, Options{Pool: d.Pool, Schema: d.Schema, Sink: sink, Index: noIDs}); !errors.Is(err, documents.ErrNoIDs) || !strings.Contains(err.Error(), "--ids-sql") {
			t.Errorf("a definition without an ids query: %v", err)
		}
		// Progress of another definition is not continued.
		d.Exec(t, `INSERT INTO {s}.backfills (index_name, source_hash, last_key) VALUES ($1, 'other', '1')`, d.Name)
		if _, err := Run(ctx, Options{Pool: d.Pool, Schema: d.Schema, Sink: sink, Index: d.Name}); err == nil || !strings.Contains(err.Error(), "another definition") {
			t.Errorf("progress of another definition: %v", err)
		}
		if rep, err := Run(ctx, Options{Pool: d.Pool, Schema: d.Schema, Sink: sink, Index: d.Name, Restart: true}); err != nil || rep.Rows != 2 || rep.From != "" {
			t.Errorf("restart: %+v, %v", rep, err)
		}
	})
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
