package tooltest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/relay/relaytest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// Docs is a definition-fed index over three tables of a fresh outbox
// schema, the README's example: tutorials, their authors (one author's
// name in many documents) and their tags (a tutorial's list): the fixture
// of the tools' tests of definition-fed indexes.
type Docs struct {
	ES     *elasticsearch.Client
	Name   string // the index name N
	Pool   *pgxpool.Pool
	Schema string
	S      string // the schema, quoted
}

// DocsAuthorsPer is how many tutorials share an author in NewDocs.
const DocsAuthorsPer = 20

// NewDocs creates the tables with tutorials tutorials (ids 1..n, author
// 1 + id % (n/DocsAuthorsPer + 1), two tags each), then defines N and
// watches the three tables: the rows already there have no refresh
// events, so the index stays empty until something loads it.
func NewDocs(t *testing.T, tutorials int) *Docs {
	t.Helper()
	es, name := Index(t, "docs-")
	pool, schemaName := schematest.Setup(t)
	d := &Docs{ES: es, Name: name, Pool: pool, Schema: schemaName, S: pgx.Identifier{schemaName}.Sanitize()}
	authors := tutorials/DocsAuthorsPer + 1
	d.Exec(t, fmt.Sprintf(`CREATE TABLE {s}.authors (id bigint PRIMARY KEY, name text NOT NULL);
		CREATE TABLE {s}.tutorials (id bigint PRIMARY KEY, title text NOT NULL, author_id bigint NOT NULL REFERENCES {s}.authors, bump bigint NOT NULL DEFAULT 0);
		CREATE TABLE {s}.tags (id bigserial PRIMARY KEY, tutorial_id bigint NOT NULL REFERENCES {s}.tutorials ON DELETE CASCADE, name text NOT NULL);
		CREATE INDEX ON {s}.tags (tutorial_id);
		CREATE INDEX ON {s}.tutorials (author_id);
		INSERT INTO {s}.authors SELECT i, 'author ' || i FROM generate_series(1, %[1]d) i;
		INSERT INTO {s}.tutorials SELECT i, 'tutorial ' || i, 1 + i %% %[1]d FROM generate_series(1, %[2]d) i;
		INSERT INTO {s}.tags (tutorial_id, name) SELECT i, 'tag ' || (i %% 7) || '-' || k FROM generate_series(1, %[2]d) i, generate_series(1, 2) k`, authors, tutorials))
	ctx := context.Background()
	if _, err := documents.Define(ctx, pool, schemaName, documents.DefineOptions{Index: name, SQL: d.Definition(), IDsSQL: d.SQL(`SELECT id FROM {s}.tutorials`), Operator: "test"}); err != nil {
		t.Fatal(err)
	}
	for _, w := range [][2]string{
		{"tutorials", "id"},
		{"tags", "tutorial_id"},
		{"authors", "SELECT t.id FROM {s}.tutorials t WHERE t.author_id = $1.id"},
	} {
		if _, err := documents.AddWatch(ctx, pool, schemaName, documents.WatchOptions{Index: name, Table: d.S + "." + w[0], Key: d.SQL(w[1]), Operator: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// Definition is the tutorials' document; $1 cast to the key's type, so
// the ids are found through the primary key.
func (d *Docs) Definition() string {
	return d.SQL(`SELECT t.id::text, jsonb_build_object('title', t.title, 'author', a.name, 'bump', t.bump,
		'tags', (SELECT coalesce(jsonb_agg(g.name ORDER BY g.name), '[]') FROM {s}.tags g WHERE g.tutorial_id = t.id))
		FROM {s}.tutorials t JOIN {s}.authors a ON a.id = t.author_id WHERE t.id = ANY($1::text[]::bigint[])`)
}

// SQL replaces {s} with the quoted schema.
func (d *Docs) SQL(q string) string { return strings.ReplaceAll(q, "{s}", d.S) }

// Exec runs q ({s} replaced), failing the test on an error.
func (d *Docs) Exec(t testing.TB, q string, args ...any) {
	t.Helper()
	if _, err := d.Pool.Exec(context.Background(), d.SQL(q), args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// Sink is the relay's sink as cmd/outboxd wires it for a definition-fed
// index: the documents sink in front of the Elasticsearch sink.
func (d *Docs) Sink(t testing.TB, next documents.Next) *documents.Sink {
	t.Helper()
	if next == nil {
		next = NewSink(t, indexer.Options{Client: d.ES, JSONB: true})
	}
	s, err := documents.NewSink(documents.SinkOptions{Pool: d.Pool, Schema: d.Schema, Next: next})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// StartRelay runs a relay over Sink in this process until the returned
// stop (or the test's end).
func (d *Docs) StartRelay(t *testing.T) (stop func()) {
	t.Helper()
	return relaytest.Start(t, relay.Config{Pool: d.Pool, Schema: d.Schema, Sink: d.Sink(t, nil), LeaseInterval: 100 * time.Millisecond,
		BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second,
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// WaitBacklog waits until the relay runs its stream and has acknowledged
// every event.
func (d *Docs) WaitBacklog(t *testing.T) { WaitBacklog(t, d.Pool, d.Schema) }

// WaitBacklog waits until a relay runs a stream of the outbox schema and
// has acknowledged every event.
func WaitBacklog(t *testing.T, pool *pgxpool.Pool, schemaName string) {
	t.Helper()
	waitBacklog(t, pool, schemaName, true)
}

// Expected is what the definition returns now for every tutorial.
func (d *Docs) Expected(t testing.TB) map[string]json.RawMessage {
	t.Helper()
	ctx := context.Background()
	var ids []string
	if err := d.Pool.QueryRow(ctx, d.SQL(`SELECT coalesce(array_agg(id::text), '{}') FROM {s}.tutorials`)).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	rows, err := d.Pool.Query(ctx, d.Definition(), ids)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]json.RawMessage{}
	for rows.Next() {
		var id string
		var doc []byte
		if err := rows.Scan(&id, &doc); err != nil {
			t.Fatal(err)
		}
		out[id] = doc
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// IndexDoc is a document behind the write alias: a tombstone has Deleted.
type IndexDoc struct {
	Version int64
	Source  json.RawMessage
	Deleted bool
}

// IndexDocs scrolls every document behind N's write alias, tombstones
// included (none when N does not exist yet).
func IndexDocs(t testing.TB, es *elasticsearch.Client, name string) map[string]IndexDoc {
	t.Helper()
	out := map[string]IndexDoc{}
	alias := indexer.WriteAlias(name)
	if st, _ := estest.Call(t, es, "POST", "/"+alias+"/_refresh", ""); st == 404 {
		return out
	}
	st, b := estest.Call(t, es, "POST", "/"+alias+"/_search?scroll=1m", `{"size":5000,"version":true,"sort":["_doc"]}`)
	for {
		var page struct {
			ScrollID string `json:"_scroll_id"`
			Hits     struct {
				Hits []struct {
					ID      string          `json:"_id"`
					Version int64           `json:"_version"`
					Source  json.RawMessage `json:"_source"`
				} `json:"hits"`
			} `json:"hits"`
		}
		if st != 200 || json.Unmarshal(b, &page) != nil {
			t.Fatalf("scan %s: %d %s", alias, st, b)
		}
		if len(page.Hits.Hits) == 0 {
			estest.Call(t, es, "DELETE", "/_search/scroll", `{"scroll_id":"`+page.ScrollID+`"}`)
			return out
		}
		for _, h := range page.Hits.Hits {
			out[h.ID] = IndexDoc{Version: h.Version, Source: h.Source, Deleted: estest.IsTombstone(h.Source)}
		}
		st, b = estest.Call(t, es, "POST", "/_search/scroll", `{"scroll":"1m","scroll_id":"`+page.ScrollID+`"}`)
	}
}

// Drift is how an index differs from its definition's result.
type Drift struct{ Missing, Stale, Extra, TombstonesVisible int }

func (d Drift) Zero() bool { return d == Drift{} }

func (d Drift) String() string {
	return fmt.Sprintf("missing %d, stale %d, extra %d, tombstones visible %d", d.Missing, d.Stale, d.Extra, d.TombstonesVisible)
}

// Compare compares want (by source id) with N's documents: missing (no
// live document), stale (other content), extra (a live document want
// lacks), and tombstones a search through N itself returns.
func Compare(t testing.TB, es *elasticsearch.Client, name string, want map[string]json.RawMessage) Drift {
	t.Helper()
	docs := IndexDocs(t, es, name)
	var d Drift
	for id, doc := range want {
		switch s, ok := docs[id]; {
		case !ok || s.Deleted:
			d.Missing++
		case !indexer.JSONEqual(doc, s.Source):
			d.Stale++
		}
	}
	for id, s := range docs {
		if _, ok := want[id]; !ok && !s.Deleted {
			d.Extra++
		}
	}
	if len(docs) > 0 {
		d.TombstonesVisible = estest.Count(t, es, name, `{"query":{"term":{"outboxd_deleted":true}}}`)
	}
	return d
}

// Drift compares N with what the definition returns now.
func (d *Docs) Drift(t testing.TB) Drift { return Compare(t, d.ES, d.Name, d.Expected(t)) }
