package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/schema/schematest"
)

// testEnv is a server on real PostgreSQL with fresh outbox and tutorials
// schemas, behind httptest.
type testEnv struct {
	pool   *pgxpool.Pool
	outbox string // outbox schema name
	tables string // tutorials schema name
	srv    *Server
	ts     *httptest.Server
	reg    *prometheus.Registry
}

func setup(t *testing.T, configure ...func(*Config)) *testEnv {
	t.Helper()
	pool, outbox := schematest.Setup(t)
	tables := schematest.Name("tut_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Migrate(ctx, pool, tables); err != nil {
		t.Fatalf("migrate tutorials: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		id, _ := schema.Ident(tables)
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+id+` CASCADE`); err != nil {
			t.Logf("drop schema %s: %v", tables, err)
		}
	})
	reg := prometheus.NewRegistry()
	cfg := Config{
		Pool:         pool,
		Schema:       tables,
		OutboxSchema: outbox,
		Index:        schematest.Name("tut-"),
		Registerer:   reg,
		Gatherer:     reg,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range configure {
		f(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewUnstartedServer(srv)
	ts.Config = srv.HTTPServer() // the server example-api runs, timeouts included
	ts.Start()
	t.Cleanup(ts.Close)
	return &testEnv{pool: pool, outbox: outbox, tables: tables, srv: srv, ts: ts, reg: reg}
}

// response is a finished HTTP exchange.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) replayed() bool { return r.header.Get(HeaderReplayed) == "true" }

func (r response) json(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (r response) apiError(t testing.TB) APIError {
	t.Helper()
	var e APIError
	r.json(t, &e)
	return e
}

// send makes one request; an empty user or key leaves that header out.
func (e *testEnv) send(t testing.TB, method, path, user, key, body string) (response, error) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequest(method, e.ts.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.Header.Set(HeaderUserID, user)
	}
	if key != "" {
		req.Header.Set(HeaderIdempotencyKey, key)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := e.ts.Client().Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: res.StatusCode, header: res.Header, body: bytes.TrimSpace(b)}, nil
}

func (e *testEnv) do(t testing.TB, method, path, user, key, body string) response {
	t.Helper()
	r, err := e.send(t, method, path, user, key, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func (e *testEnv) create(t testing.TB, user, key, body string) Tutorial {
	t.Helper()
	r := e.do(t, "POST", "/api/tutorials", user, key, body)
	if r.status != http.StatusCreated {
		t.Fatalf("create: want 201, got %d %s", r.status, r.body)
	}
	var tut Tutorial
	r.json(t, &tut)
	return tut
}

func (e *testEnv) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// rows counts tutorials rows, deleted ones included.
func (e *testEnv) rows(t testing.TB) int {
	return e.count(t, `SELECT count(*) FROM "`+e.tables+`".tutorials`)
}

// events counts outbox events.
func (e *testEnv) events(t testing.TB) int {
	return e.count(t, `SELECT count(*) FROM "`+e.outbox+`".events`)
}

// wantOneWrite fails the test unless exactly one tutorial row and one
// outbox event exist.
func (e *testEnv) wantOneWrite(t testing.TB) {
	t.Helper()
	if rows, events := e.rows(t), e.events(t); rows != 1 || events != 1 {
		t.Fatalf("want 1 row and 1 event, got %d rows and %d events", rows, events)
	}
}

func (e *testEnv) keyStatus(t testing.TB, user, key string) string {
	t.Helper()
	var s string
	err := e.pool.QueryRow(context.Background(), `SELECT status FROM "`+e.tables+`".idempotency_keys WHERE user_id = $1 AND key = $2`, user, key).Scan(&s)
	if err != nil {
		t.Fatalf("key status: %v", err)
	}
	return s
}

// value reads a counter.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
