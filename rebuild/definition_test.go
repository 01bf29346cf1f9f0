package rebuild

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/backfill"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// README, "Documents from several tables": rebuild --from source fills the new
// index from the definition.
func TestRebuildDefinition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a rebuild from the definition killed during the catch-up and run again, while writers change the three tables and the relay delivers their refreshes, swaps to the new mapping and ends equal to the definition", func(t *testing.T) {
		t.Parallel()
		const tutorials = 5000
		d := tooltest.NewDocs(t, tutorials)
		t.Cleanup(func() { estest.DropAll(t, d.ES, d.Name+"-0*") })
		sink := tooltest.NewSink(t, indexer.Options{Client: d.ES, JSONB: true, IndexSpec: []byte(keywordSpec)})
		if _, err := backfill.Run(ctx, backfill.Options{Pool: d.Pool, Schema: d.Schema, Sink: sink, Index: d.Name}); err != nil {
			t.Fatal(err)
		}
		d.StartRelay(t)
		wr := d.StartWriters(t, 3, tutorials, 2*time.Millisecond)
		o := Options{Pool: d.Pool, Schema: d.Schema, ES: d.ES, Index: d.Name, From: "source", Mappings: []byte(textMappings), Grace: 500 * time.Millisecond, Batch: 500}
		killed, kill := context.WithCancel(ctx)
		o.Logger = slog.New(cancelOn{msg: "rebuild caught up", cancel: kill})
		first, err := Run(killed, o)
		if !errors.Is(err, context.Canceled) || first.Copied < tutorials*9/10 {
			t.Fatalf("first run: %+v, %v; want every document copied from the definition, then a kill after the first catch-up round", first, err)
		}
		o.Logger = nil
		rep, err := Run(ctx, o)
		if err != nil || !rep.Swapped || rep.Resumed != PhaseCatchingUp || rep.NewIndex != d.Name+"-000002" {
			t.Fatalf("second run: %+v, %v; want it to continue the catch-up and swap", rep, err)
		}
		wr.Halt()
		if wr.Changes.Load() == 0 {
			t.Fatal("the writers changed nothing")
		}
		d.WaitBacklog(t)
		if got := aliasTarget(t, d.ES, indexer.WriteAlias(d.Name)); got != rep.NewIndex {
			t.Fatalf("%s points at %s", indexer.WriteAlias(d.Name), got)
		}
		if st, b := estest.Call(t, d.ES, "GET", "/"+rep.NewIndex+"/_mapping/field/title", ""); st != 200 || !strings.Contains(string(b), `"type":"text"`) {
			t.Fatalf("mapping of title: %d %s", st, b)
		}
		t.Logf("rebuild: %d copied, %d caught up in %d rounds; writers: %d changes", first.Copied, first.CaughtUp+rep.CaughtUp, first.Rounds+rep.Rounds, wr.Changes.Load())
		if dr := d.Drift(t); !dr.Zero() {
			t.Fatalf("index vs definition: %s", dr)
		}
	})

	t.Run("from=source needs a query or a definition, and a definition-fed index refuses a query", func(t *testing.T) {
		t.Parallel()
		d := tooltest.NewDocs(t, 1)
		pool, bare := schematest.Setup(t)
		for _, c := range []struct {
			name string
			o    Options
			want string
		}{
			{"no definition and no query", Options{Pool: pool, Schema: bare, ES: d.ES, Index: d.Name, From: "source"}, "source_sql: required with from=source: index " + d.Name + " has no document definition"},
			{"a query for a definition-fed index", Options{Pool: d.Pool, Schema: d.Schema, ES: d.ES, Index: d.Name, From: "source", SourceSQL: d.SQL(`SELECT id, 1, '{}'::jsonb FROM {s}.tutorials`)}, "is definition-fed"},
		} {
			if _, err := Run(ctx, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v; want %q", c.name, err, c.want)
			}
		}
	})
}
