package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// testSink applies upserts like the Elasticsearch sink would: a version
// at or below the stored one is stale; a document with "bad": true is
// rejected. hold makes Write wait, so a backlog builds up.
type testSink struct {
	mu       sync.Mutex
	versions map[string]int64
	delay    time.Duration
	held     chan struct{} // non-nil: Write waits until it is closed
}

func (s *testSink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	s.mu.Lock()
	held, delay := s.held, s.delay
	s.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	outs := make([]outbox.Outcome, len(events))
	for i, e := range events {
		var doc struct{ Bad bool }
		_ = json.Unmarshal(e.Document, &doc)
		key := e.IndexName + "/" + e.SourceID
		switch {
		case doc.Bad:
			outs[i] = outbox.Outcome{Status: outbox.Rejected, Reason: "mapper_parsing_exception: failed to parse field [price] of type [long]"}
		case e.Version <= s.versions[key]:
			outs[i] = outbox.Outcome{Status: outbox.Stale}
		default:
			s.versions[key] = e.Version
			outs[i] = outbox.Outcome{Status: outbox.Applied}
		}
	}
	return outs, nil
}

func (s *testSink) hold() {
	s.mu.Lock()
	s.held = make(chan struct{})
	s.mu.Unlock()
}

func (s *testSink) release() {
	s.mu.Lock()
	if s.held != nil {
		close(s.held)
		s.held = nil
	}
	s.mu.Unlock()
}

type testEnv struct {
	pool   *pgxpool.Pool
	schema string
	outbox *outbox.Outbox
	reg    *prometheus.Registry
	sink   *testSink
	relay  *relay.Relay
	jobs   *jobs.Scheduler
	srv    *admin.Server
	base   string
	quiet  *slog.Logger
}

func setup(t *testing.T) *testEnv {
	t.Helper()
	pool, name := schematest.Setup(t)
	ob, err := outbox.NewOutbox(name)
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{pool: pool, schema: name, outbox: ob, reg: prometheus.NewRegistry(), sink: &testSink{versions: map[string]int64{}},
		quiet: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// goRun runs fn until the test ends, then cancels it and waits.
func goRun(t *testing.T, what string, fn func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s did not stop", what)
		}
	})
}

// startRelay runs a relay over the test schema with the test sink.
func (e *testEnv) startRelay(t *testing.T) {
	t.Helper()
	r, err := relay.New(relay.Config{Pool: e.pool, Schema: e.schema, Sink: e.sink, Registerer: e.reg, Logger: e.quiet,
		MaxBatchDocs: 50, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, MaxAttempts: 3, LeaseInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.relay = r
	t.Cleanup(e.sink.release) // registered before goRun's, so it runs after the relay's cancel
	goRun(t, "relay", r.Run)
	schematest.Eventually(t, 15*time.Second, "the relay leads its stream", func() bool { return len(r.Leading()) == 1 })
}

// startAdmin runs the admin server with cfg completed from e.
func (e *testEnv) startAdmin(t *testing.T, cfg admin.Config) {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	cfg.Gatherer = e.reg
	cfg.Logger = e.quiet
	cfg.Stats = func(ctx context.Context) (*relay.Stats, error) { return relay.CollectStats(ctx, e.pool, e.schema) }
	if cfg.Ready == nil {
		es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{schematest.ElasticsearchURL(t)}, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Ready = map[string]func(context.Context) error{
			"postgres":      e.pool.Ping,
			"elasticsearch": func(ctx context.Context) error { return indexer.Ping(ctx, es) },
		}
	}
	if e.relay != nil && cfg.Role == nil {
		cfg.Role = admin.RoleOf(e.relay)
	}
	if e.jobs != nil && cfg.Jobs == nil {
		cfg.Jobs = e.jobs.Status
	}
	if cfg.SampleInterval == 0 {
		cfg.SampleInterval = 250 * time.Millisecond
	}
	srv, err := admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv, e.base = srv, "http://"+srv.Addr()
	goRun(t, "admin server", srv.Run)
}

type event struct {
	index, source string
	version       int64
	doc           string
}

func (e *testEnv) append(t *testing.T, evs ...event) {
	t.Helper()
	ctx := context.Background()
	for _, ev := range evs {
		if _, err := e.outbox.Append(ctx, e.pool, outbox.Event{IndexName: ev.index, SourceID: ev.source, Version: ev.version,
			Op: outbox.OpUpsert, Document: json.RawMessage(ev.doc)}); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *testEnv) stats(t *testing.T) *relay.Stats {
	t.Helper()
	st, err := relay.CollectStats(context.Background(), e.pool, e.schema)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (e *testEnv) backlog(t *testing.T) int64 {
	t.Helper()
	var n int64
	for _, s := range e.stats(t).Streams {
		n += s.Backlog
	}
	return n
}

// get fetches path from the admin server with optional headers.
func (e *testEnv) get(t *testing.T, path string, header ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest("GET", e.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// metrics is a scrape of /metrics: series -> value.
type metrics map[string]float64

var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

func (e *testEnv) scrape(t *testing.T, header ...string) metrics {
	t.Helper()
	code, body, _ := e.get(t, "/metrics", header...)
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	m := metrics{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		m[line[:i]] = v
	}
	return m
}

// sum adds the series of name whose labels include every given pair.
func (m metrics) sum(name string, labels ...string) float64 {
	var total float64
	for series, v := range m {
		n, rest, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		have := map[string]string{}
		for _, kv := range labelRE.FindAllStringSubmatch(rest, -1) {
			have[kv[1]] = kv[2]
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				ok = false
			}
		}
		if ok {
			total += v
		}
	}
	return total
}

func (m metrics) has(name string) bool {
	for series := range m {
		if n, _, _ := strings.Cut(series, "{"); n == name {
			return true
		}
	}
	return false
}

func docs(index string, from, n int, version int64, extra string) []event {
	out := make([]event, n)
	for i := range out {
		out[i] = event{index: index, source: fmt.Sprintf("doc-%d", from+i), version: version, doc: `{"title":"t"` + extra + `}`}
	}
	return out
}
