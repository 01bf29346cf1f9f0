package indexer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// runRelay runs a relay over the outbox in schemaName with sink until the
// test ends; attempts and backoff are short so dead-lettering is quick.
func runRelay(t *testing.T, pool *pgxpool.Pool, schemaName string, sink relay.Sink) *relay.Relay {
	t.Helper()
	r, err := relay.New(relay.Config{
		Pool: pool, Schema: schemaName, Sink: sink, MaxAttempts: 3,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, LeaseInterval: 100 * time.Millisecond,
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

func backlogOf(t *testing.T, pool *pgxpool.Pool, schemaName string) int64 {
	t.Helper()
	st, err := relay.CollectStats(context.Background(), pool, schemaName)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Streams) == 0 {
		return -1 // no progress row yet
	}
	return st.Backlog()
}

type parked struct{ sourceID, reason, kind string }

func deadLetters(t *testing.T, pool *pgxpool.Pool, schemaName string) []parked {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT source_id, reason, kind FROM "`+schemaName+`".dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []parked
	for rows.Next() {
		var p parked
		if err := rows.Scan(&p.sourceID, &p.reason, &p.kind); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// coordinatingLimit is the smallest indexing-pressure limit of the test
// cluster's nodes: a bulk request larger than it is refused as a whole.
func coordinatingLimit(t *testing.T, s *Sink) int64 {
	t.Helper()
	st, b := esCall(t, s.es, "GET", "/_nodes/stats/indexing_pressure?filter_path=nodes.*.indexing_pressure.memory.limit_in_bytes", "")
	if st != 200 {
		t.Fatalf("indexing pressure: %d %s", st, b)
	}
	var r struct {
		Nodes map[string]struct {
			IndexingPressure struct {
				Memory struct {
					Limit int64 `json:"limit_in_bytes"`
				} `json:"memory"`
			} `json:"indexing_pressure"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Nodes) == 0 {
		t.Fatalf("indexing pressure: %s", b)
	}
	var limit int64
	for _, n := range r.Nodes {
		if l := n.IndexingPressure.Memory.Limit; limit == 0 || l < limit {
			limit = l
		}
	}
	return limit
}

func TestSinkOneEventNeverStallsItsStream(t *testing.T) {
	t.Parallel()

	t.Run("a document over the coordinating indexing-pressure limit is dead-lettered and the events after it arrive", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		pool, schemaName := schematest.Setup(t)
		sink := newSink(t, Options{Client: es})
		limit := coordinatingLimit(t, sink)
		size := int(limit) + 2<<20
		if size > 90<<20 {
			t.Skipf("indexing pressure limit %d bytes: a document over it would pass http.max_content_length (100 MB by default)", limit)
		}
		big := `{"blob":"` + strings.Repeat("x", size) + `"}`
		events := []outbox.Event{{IndexName: name, SourceID: "big", Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(big)}}
		for i := range 100 {
			events = append(events, upsert(name, fmt.Sprintf("n%03d", i), 1, docN(int64(i))))
		}
		ob, err := outbox.NewOutbox(schemaName)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.AppendBatch(context.Background(), pool, events); err != nil {
			t.Fatal(err)
		}
		runRelay(t, pool, schemaName, sink)
		schematest.Eventually(t, 3*time.Minute, "every event has an outcome", func() bool { return backlogOf(t, pool, schemaName) == 0 })
		dead := deadLetters(t, pool, schemaName)
		if len(dead) != 1 || dead[0].sourceID != "big" {
			t.Fatalf("dead letters %+v, want only big", dead)
		}
		if dead[0].kind != "rejected" {
			t.Errorf("dead letter kind %q, want rejected at once: a document over the limit never fits", dead[0].kind)
		}
		for _, want := range []string{"429", "rejected_execution_exception", "coordinating_operation_bytes"} {
			if !strings.Contains(dead[0].reason, want) {
				t.Errorf("reason %q does not mention %q", dead[0].reason, want)
			}
		}
		docs := searchRead(t, es, name)
		if _, ok := docs["big"]; ok || len(docs) != 100 {
			t.Fatalf("read alias holds %d documents (big: %v), want the 100 normal ones", len(docs), ok)
		}
	})

	t.Run("a payload a proxy refuses with 403 is charged to its event alone", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		p := newFaultProxy(t)
		s := newSink(t, Options{Client: client(t, p.URL)})
		mustWrite(t, s, upsert(name, "warm", 1, `{}`))
		marker := "<script>"
		p.refusePayload.Store(&marker)
		out := mustWrite(t, s, upsert(name, "a", 1, `{"t":"ok"}`), upsert(name, "bad", 1, `{"t":"<script>"}`), upsert(name, "c", 1, `{"t":"ok"}`))
		if got := statuses(out); got != "applied retry applied" || out[1].Outage || !strings.Contains(out[1].Reason, "HTTP 403") {
			t.Fatalf("got %s %+v", got, out)
		}
		if docs := searchRead(t, es, name); len(docs) != 3 {
			t.Fatalf("read alias: %v", docs)
		}
	})

	t.Run("a whole bulk answered 429 once while a one-item request passes is split and applied", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		p := newFaultProxy(t)
		s := newSink(t, Options{Client: client(t, p.URL)})
		mustWrite(t, s, upsert(name, "warm", 1, `{}`))
		p.throttleAll.Store(1)
		if got := statuses(mustWrite(t, s, upsert(name, "a", 1, `{}`), upsert(name, "b", 1, `{}`))); got != "applied applied" {
			t.Fatalf("got %s", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 3 {
			t.Fatalf("read alias: %v", docs)
		}
	})

	t.Run("no bulk request with more than one event exceeds the byte cap and an event over it goes alone", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		p := newFaultProxy(t)
		const limit = 4096
		s := newSink(t, Options{Client: client(t, p.URL), MaxBatchBytes: limit})
		var events []outbox.Event
		for i := range 60 {
			// Control characters in ids are escaped six-fold in the body,
			// which the sink's size estimate does not see.
			id := fmt.Sprintf("e%02d", i) + strings.Repeat("\x01", 40)
			events = append(events, upsert(name, id, 1, `{"t":"`+strings.Repeat("y", 30)+`"}`))
		}
		events = append(events, upsert(name, "huge", 1, `{"t":"`+strings.Repeat("z", 3*limit)+`"}`))
		if got := statuses(mustWrite(t, s, events...)); strings.Count(got, "applied") != len(events) {
			t.Fatalf("got %s", got)
		}
		if m := p.maxBulk.Load(); m > limit {
			t.Fatalf("a bulk request of several events carried %d bytes, over the %d cap", m, limit)
		}
		if docs := searchRead(t, es, name); len(docs) != len(events) {
			t.Fatalf("read alias holds %d documents, want %d", len(docs), len(events))
		}
	})
}

func TestSinkServerVersion(t *testing.T) {
	t.Parallel()

	t.Run("a server before 8.18 gets no include_source_on_error and applies events", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		if openSearch(t, es) {
			t.Skip("fakes Elasticsearch's versions in front of the server: Elasticsearch only")
		}
		p := newFaultProxy(t)
		v := "8.17.0"
		p.fakeVersion.Store(&v)
		p.refuseSourceParam.Store(true)
		s := newSink(t, Options{Client: client(t, p.URL)})
		if got := statuses(mustWrite(t, s, upsert(name, "a", 1, `{}`), upsert(name, "b", 1, `{}`))); got != "applied applied" {
			t.Fatalf("got %s", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 2 {
			t.Fatalf("read alias: %v", docs)
		}
	})

	t.Run("a server refusing a bulk parameter pauses the relay without dead letters and says why", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		if openSearch(t, es) {
			t.Skip("fakes Elasticsearch's versions in front of the server: Elasticsearch only")
		}
		if !currentElasticsearch(t, es) {
			t.Skip("needs a server that takes include_source_on_error (Elasticsearch 8.18 or later)")
		}
		pool, schemaName := schematest.Setup(t)
		p := newFaultProxy(t)
		// The server says 8.19 but refuses the parameter: every bulk fails
		// the way it would if the version were misdetected.
		p.refuseSourceParam.Store(true)
		s := newSink(t, Options{Client: client(t, p.URL)})
		ob, err := outbox.NewOutbox(schemaName)
		if err != nil {
			t.Fatal(err)
		}
		var events []outbox.Event
		for i := range 20 {
			events = append(events, upsert(name, fmt.Sprintf("s%02d", i), 1, docN(int64(i))))
		}
		if _, err := ob.AppendBatch(context.Background(), pool, events); err != nil {
			t.Fatal(err)
		}
		r := runRelay(t, pool, schemaName, s)
		schematest.Eventually(t, time.Minute, "the relay reports the stream paused", func() bool { return r.Paused()["default"] != "" })
		reason := r.Paused()["default"]
		if !strings.Contains(reason, "include_source_on_error") || !strings.Contains(reason, "configuration") {
			t.Fatalf("paused reason %q does not name the parameter and the configuration", reason)
		}
		time.Sleep(time.Second) // several more rounds, each charging nothing
		if dead := deadLetters(t, pool, schemaName); len(dead) != 0 {
			t.Fatalf("dead letters: %+v", dead)
		}
		if n := backlogOf(t, pool, schemaName); n != 20 && n != -1 {
			t.Fatalf("backlog %d, want 20", n)
		}
		// Once the server reports its true version the sink omits the parameter.
		v := "8.17.0"
		p.fakeVersion.Store(&v)
		schematest.Eventually(t, time.Minute, "the backlog drains after the sink re-detects the version", func() bool { return backlogOf(t, pool, schemaName) == 0 })
		if got := r.Paused(); len(got) != 0 {
			t.Fatalf("still paused: %v", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 20 {
			t.Fatalf("read alias holds %d documents, want 20", len(docs))
		}
	})

	t.Run("credentials that cannot read the version assume a current server and apply events", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		if openSearch(t, es) {
			t.Skip("fakes Elasticsearch's versions in front of the server: Elasticsearch only")
		}
		if !currentElasticsearch(t, es) {
			t.Skip("needs a server that takes include_source_on_error (Elasticsearch 8.18 or later)")
		}
		p := newFaultProxy(t)
		p.forbidInfo.Store(true)
		s := newSink(t, Options{Client: client(t, p.URL)})
		if got := statuses(mustWrite(t, s, upsert(name, "a", 1, `{}`))); got != "applied" {
			t.Fatalf("got %s", got)
		}
		if docs := searchRead(t, es, name); len(docs) != 1 {
			t.Fatalf("read alias: %v", docs)
		}
	})

	t.Run("an Elasticsearch before 8.0 is a configuration error", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		if openSearch(t, es) {
			t.Skip("fakes Elasticsearch's versions in front of the server: Elasticsearch only")
		}
		p := newFaultProxy(t)
		v := "7.17.28"
		p.fakeVersion.Store(&v)
		s := newSink(t, Options{Client: client(t, p.URL)})
		out, err := s.Write(context.Background(), []outbox.Event{upsert(name, "a", 1, `{}`)})
		if !IsConfig(err) || out != nil || !strings.Contains(err.Error(), "Elasticsearch 7.17.28 is not supported; outboxd needs Elasticsearch 8.0 or later") {
			t.Fatalf("Write: %v %v", out, err)
		}
	})

	t.Run("versions from 8.18 take include_source_on_error and unparsable version strings are refused", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			version string
			param   bool
		}{{"8.17.3", false}, {"8.18.0", true}, {"8.19.14", true}, {"9.1.0-SNAPSHOT", true}} {
			v, err := parseVersion(c.version)
			if err != nil || v.sourceOnErrorParam() != c.param {
				t.Errorf("%s: %+v %v, want include_source_on_error %v", c.version, v, err, c.param)
			}
		}
		if _, err := parseVersion("eight"); err == nil {
			t.Error("eight: parsed")
		}
	})
}

func TestCheckIndexSpec(t *testing.T) {
	t.Parallel()
	es, _ := setup(t)
	ctx := context.Background()
	if err := CheckIndexSpec(ctx, es, []byte(`{"settings":{"index":{"number_of_shards":1}},"mappings":{"properties":{"title":{"type":"text"}}}}`)); err != nil {
		t.Fatalf("a valid spec: %v", err)
	}
	for spec, want := range map[string]string{
		`{"mappings":{"properties":{"title":{"type":"nonsense"}}}}`: "[nonsense] declared on field [title]",
		`{"settings":{"index":{"bogus_setting":1}}}`:                "unknown setting [index.bogus_setting]",
		`{"settings":{"index":{"number_of_shards":"abc"}}}`:         "Failed to parse value [abc] for setting [index.number_of_shards]",
		`{"aliases":{}}`: "aliases: outboxd owns the aliases",
	} {
		err := CheckIndexSpec(ctx, es, []byte(spec))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "index spec") {
			t.Errorf("%s: %v, want an error naming the index spec and %q", spec, err, want)
		}
	}
}

func TestSinkRefusedIndexSpecIsAConfigurationError(t *testing.T) {
	t.Parallel()
	es, name := setup(t)
	// Well-formed for NewSink, refused by Elasticsearch when the index is created.
	s := newSink(t, Options{Client: es, IndexSpec: []byte(`{"mappings":{"properties":{"title":{"type":"txet"}}}}`)})
	out, err := s.Write(context.Background(), []outbox.Event{upsert(name, "a", 1, `{}`), upsert(name, "b", 1, `{}`)})
	if !IsConfig(err) || out != nil || !strings.Contains(err.Error(), "txet") {
		t.Fatalf("Write: %v %v, want a configuration error naming the mapping and no outcomes", statuses(out), err)
	}
}
