package documents_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

func refreshes(index string, ids ...string) []outbox.Event {
	out := make([]outbox.Event, len(ids))
	for i, id := range ids {
		out[i] = outbox.Event{ID: int64(i + 1), IndexName: index, SourceID: id, Version: 1, Op: outbox.OpRefresh}
	}
	return out
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestSink(t *testing.T) {
	t.Parallel()

	t.Run("through the relay the index ends equal to the definition after changes in every table", func(t *testing.T) {
		t.Parallel()
		e, x := setup(t), esSetup(t)
		e.define(t, x.name)
		e.watchAll(t, x.name)
		e.runRelay(t, docSink(t, e, x, nil))
		converged := func(what string) {
			t.Helper()
			var d drift
			schematest.Eventually(t, 30*time.Second, what+": the index equals the definition", func() bool {
				docs, visible := x.state(t)
				d = compare(t, e.expected(t, x.name, `SELECT id FROM {s}.tutorials`), docs, visible)
				return d.zero()
			})
		}
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'), (2, 'bob');
			INSERT INTO {s}.tutorials (id, title, author_id) VALUES (10, 'a', 1), (11, 'b', 1), (12, 'c', 2);
			INSERT INTO {s}.tags VALUES (100, 10, 'go'), (101, 10, 'sql'), (102, 12, 'es')`)
		converged("inserts")
		e.exec(t, `UPDATE {s}.authors SET name = 'ann2' WHERE id = 1; UPDATE {s}.tags SET tutorial_id = 11 WHERE id = 101;
			DELETE FROM {s}.tags WHERE id = 102; UPDATE {s}.tutorials SET title = 'c2', author_id = 1 WHERE id = 12`)
		converged("edits and moves")
		e.exec(t, `DELETE FROM {s}.tutorials WHERE id = 10`)
		converged("a delete")
		docs, _ := x.state(t)
		if d := docs["10"]; !d.Deleted || d.Version < 1e15 {
			t.Fatalf("the deleted tutorial: %+v, want a tombstone at a read version", d)
		}
		e.exec(t, `INSERT INTO {s}.tutorials (id, title, author_id) VALUES (10, 'again', 2)`)
		converged("a re-created tutorial")
	})

	t.Run("a later read carries a higher version, so an older read arriving late is stale", func(t *testing.T) {
		t.Parallel()
		e, x := setup(t), esSetup(t)
		e.define(t, x.name)
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'); INSERT INTO {s}.tutorials (id, title, author_id) VALUES (1, 'old', 1)`)
		r, err := documents.NewReader(e.pool, e.schema, 0)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		older, err := r.Read(ctx, x.name, []string{"1"})
		if err != nil {
			t.Fatal(err)
		}
		e.exec(t, `UPDATE {s}.tutorials SET title = 'new' WHERE id = 1`)
		newer, err := r.Read(ctx, x.name, []string{"1"})
		if err != nil {
			t.Fatal(err)
		}
		if newer.Version <= older.Version {
			t.Fatalf("versions %d then %d", older.Version, newer.Version)
		}
		es, err := indexer.NewSink(indexer.Options{Client: x.es, JSONB: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			res  *documents.Result
			want outbox.Status
		}{{newer, outbox.Applied}, {older, outbox.Stale}} {
			out, err := es.Write(ctx, []outbox.Event{{IndexName: x.name, SourceID: "1", Version: c.res.Version, Op: outbox.OpUpsert, Document: c.res.Docs["1"]}})
			if err != nil || out[0].Status != c.want {
				t.Fatalf("writing the read at %d: %+v, %v; want %v", c.res.Version, out, err, c.want)
			}
		}
		docs, _ := x.state(t)
		if !strings.Contains(string(docs["1"].Source), `"new"`) {
			t.Fatalf("stored %s", docs["1"].Source)
		}
	})

	t.Run("refreshes of one id in a page cost one read, and every one gets its outcome", func(t *testing.T) {
		t.Parallel()
		e, x := setup(t), esSetup(t)
		e.define(t, x.name)
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'); INSERT INTO {s}.tutorials (id, title, author_id) VALUES (1, 'a', 1), (2, 'b', 1)`)
		reg := prometheus.NewRegistry()
		s := docSink(t, e, x, reg)
		page := append(refreshes(x.name, "1", "1", "2", "1", "3", "2"),
			outbox.Event{IndexName: x.name + "-other", SourceID: "z", Version: 3, Op: outbox.OpUpsert, Document: json.RawMessage(`{"a":1}`)})
		out, err := s.Write(context.Background(), page)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			if o.Status != outbox.Applied {
				t.Errorf("event %d (%s): %+v", i, page[i].SourceID, o)
			}
		}
		reads := counterValue(t, s.ReadsCounter().WithLabelValues(x.name, "ok"))
		ids := counterValue(t, s.IDsCounter().WithLabelValues(x.name))
		if reads != 1 || ids != 3 {
			t.Fatalf("%v reads of %v ids; want 1 read of 3", reads, ids)
		}
		docs, _ := x.state(t)
		if len(docs) != 3 || !docs["3"].Deleted || docs["1"].Deleted || docs["2"].Version != docs["1"].Version {
			t.Fatalf("stored %+v; want 1 and 2 at one version and a tombstone for 3", docs)
		}
		t.Cleanup(func() { (&esEnv{es: x.es, name: x.name + "-other"}).cleanup() })
	})

	t.Run("a definition that fails parks its refreshes with the reason, an id returned twice alone, and the rest of the page is written", func(t *testing.T) {
		t.Parallel()
		e, x := setup(t), esSetup(t)
		e.define(t, x.name)
		dup := x.name + "-dup"
		if _, err := documents.Define(context.Background(), e.pool, e.schema, documents.DefineOptions{Index: dup, Operator: "test",
			SQL: e.sql(`SELECT t.id::text, jsonb_build_object('n', n) FROM {s}.tutorials t, generate_series(1, CASE WHEN t.id = 2 THEN 2 ELSE 1 END) n WHERE t.id::text = ANY($1)`)}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { (&esEnv{es: x.es, name: dup}).cleanup() })
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'); INSERT INTO {s}.tutorials (id, title, author_id) VALUES (1, 'a', 1), (2, 'b', 1)`)
		e.exec(t, `ALTER TABLE {s}.authors RENAME COLUMN name TO full_name`)
		s := docSink(t, e, x, nil)
		page := append(refreshes(x.name, "1"), refreshes(dup, "1", "2")...)
		out, err := s.Write(context.Background(), page)
		if err != nil {
			t.Fatal(err)
		}
		if out[0].Status != outbox.Rejected || !strings.Contains(out[0].Reason, "reading index "+x.name) || !strings.Contains(out[0].Reason, "42703") {
			t.Errorf("the failing definition: %+v", out[0])
		}
		if out[1].Status != outbox.Applied {
			t.Errorf("a good id of the other index: %+v", out[1])
		}
		if out[2].Status != outbox.Rejected || !strings.Contains(out[2].Reason, "several rows") {
			t.Errorf("an id returned twice: %+v", out[2])
		}
		if err := documents.Drop(context.Background(), e.pool, e.schema, dup, "test"); err != nil {
			t.Fatal(err)
		}
		out, err = s.Write(context.Background(), refreshes(dup, "1"))
		if err != nil || out[0].Status != outbox.Rejected || !strings.Contains(out[0].Reason, "no document definition") {
			t.Errorf("a refresh of a dropped definition: %+v, %v", out, err)
		}
	})
}
