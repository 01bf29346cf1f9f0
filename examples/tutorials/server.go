package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// Defaults for Config.
const (
	DefaultIndex       = "tutorials"
	DefaultKeyTTL      = 24 * time.Hour
	DefaultLease       = 30 * time.Second
	DefaultReadTimeout = 15 * time.Second
)

// Config wires a Server. Pool is required; everything else has a default.
type Config struct {
	Pool *pgxpool.Pool
	// Schema holds the tutorials and idempotency_keys tables (DefaultSchema).
	Schema string
	// OutboxSchema is the outboxd schema events are appended to (schema.DefaultName).
	OutboxSchema string
	// Index is the events' index_name: outboxd writes through Index+"-write";
	// search reads Index, which hides tombstones.
	Index string
	// Elasticsearch serves GET /api/search; nil answers it with 503.
	Elasticsearch *elasticsearch.Client
	// KeyTTL is how long an idempotency key is remembered (DefaultKeyTTL).
	KeyTTL time.Duration
	// Lease bounds one write's transaction; it is also how long a
	// PROCESSING key committed by an earlier release is protected before
	// another request may take it over (DefaultLease).
	Lease time.Duration
	// ReadTimeout bounds reading a whole request, headers and body
	// (DefaultReadTimeout), so a client that sends its body a byte at a
	// time cannot hold a connection and a handler forever.
	ReadTimeout time.Duration
	// Registerer receives the metrics; nil keeps them unregistered.
	Registerer prometheus.Registerer
	// Gatherer, when set, is served on GET /metrics.
	Gatherer prometheus.Gatherer
	Logger   *slog.Logger
	// WebhookSecret verifies POST /api/webhooks; empty disables it.
	// WebhookPreviousSecret is also accepted while the sender rotates.
	WebhookSecret         []byte
	WebhookPreviousSecret []byte
	// CardsIndex is the definition-fed index of tutorial cards (cards.go)
	// that GET /api/authors/{id}/tutorials reads; empty answers it 503.
	// DeclareCards declares it.
	CardsIndex string
	// Notify names the webhook destination that hears of every new
	// tutorial ("tutorial-created:<id>"), appended in the creating
	// transaction; empty sends nothing.
	Notify string

	// afterCommit runs after a write committed and before its response is
	// written. Tests use it to simulate a crash in exactly that gap.
	afterCommit func(r *http.Request)
}

// Server is the example tutorials API.
type Server struct {
	pool    *pgxpool.Pool
	table   string // quoted schema.tutorials
	outbox  *outbox.Outbox
	keys    *Keys
	index   string
	es      *elasticsearch.Client
	metrics *metrics
	log     *slog.Logger
	handler http.Handler
	read    time.Duration

	authors string // quoted schema.authors
	cards   string // the cards index, "" when not configured

	notifications string         // quoted schema.notifications
	senders       []inbox.Sender // empty: POST /api/webhooks is disabled
	notify        string

	afterCommit func(r *http.Request)
}

// New checks cfg and builds the server. It does not create tables; run
// Migrate first.
func New(cfg Config) (*Server, error) {
	if cfg.Pool == nil {
		return nil, errors.New("tutorials: config: Pool is required")
	}
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if cfg.OutboxSchema == "" {
		cfg.OutboxSchema = schema.DefaultName
	}
	if cfg.Index == "" {
		cfg.Index = DefaultIndex
	}
	if cfg.KeyTTL == 0 {
		cfg.KeyTTL = DefaultKeyTTL
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.KeyTTL < 0 || cfg.Lease < 0 || cfg.ReadTimeout < 0 {
		return nil, errors.New("tutorials: config: KeyTTL, Lease and ReadTimeout must be positive")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	id, err := schema.Ident(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("tutorials: config: Schema: %w", err)
	}
	ob, err := outbox.NewOutbox(cfg.OutboxSchema)
	if err != nil {
		return nil, fmt.Errorf("tutorials: config: OutboxSchema: %w", err)
	}
	probe := outbox.Event{IndexName: cfg.Index, SourceID: "x", Op: outbox.OpDelete}
	if err := outbox.Validate(&probe); err != nil {
		return nil, fmt.Errorf("tutorials: config: Index: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("tutorials: register metrics: %w", err)
	}
	s := &Server{
		pool:        cfg.Pool,
		table:       id + ".tutorials",
		outbox:      ob,
		keys:        &Keys{pool: cfg.Pool, table: id + ".idempotency_keys", ttl: cfg.KeyTTL, lease: cfg.Lease},
		index:       cfg.Index,
		es:          cfg.Elasticsearch,
		metrics:     m,
		log:         cfg.Logger,
		read:        cfg.ReadTimeout,
		afterCommit: cfg.afterCommit,

		authors: id + ".authors",
		cards:   cfg.CardsIndex,

		notifications: id + ".notifications",
		senders:       webhookSenders(cfg),
		notify:        cfg.Notify,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/tutorials", s.create)
	mux.HandleFunc("PUT /api/tutorials/{id}", s.update)
	mux.HandleFunc("DELETE /api/tutorials/{id}", s.remove)
	mux.HandleFunc("GET /api/tutorials/{id}", s.get)
	mux.HandleFunc("GET /api/search", s.search)
	mux.HandleFunc("PUT /api/authors/{id}", s.putAuthor)
	mux.HandleFunc("GET /api/authors/{id}/tutorials", s.authorTutorials)
	// The path's last segment is accepted for older senders and ignored:
	// the source is the sender whose secret verifies the request.
	mux.HandleFunc("POST /api/webhooks", s.receive)
	mux.HandleFunc("POST /api/webhooks/{ignored}", s.receive)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	if cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	s.handler = s.count(mux)
	return s, nil
}

// HTTPServer returns an http.Server for s with every timeout set: a slow
// or idle client is cut off instead of holding a connection. The write
// timeout runs from the end of the headers to the end of the response, so
// it covers reading the body, the handler (a write is bounded by the key
// lease, a search by the Elasticsearch client's timeout, 30s by default)
// and sending the answer.
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{
		Handler:           s,
		ReadHeaderTimeout: min(5*time.Second, s.read),
		ReadTimeout:       s.read,
		WriteTimeout:      s.read + max(s.keys.lease, 30*time.Second) + 10*time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// Keys is the server's idempotency key store (for the expiry job).
func (s *Server) Keys() *Keys { return s.keys }

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// count labels requests by the mux pattern, never the raw path, so ids in
// URLs cannot blow up the metric's cardinality.
func (s *Server) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		if rec.code == 0 {
			rec.code = http.StatusOK
		}
		s.metrics.requests.WithLabelValues(route, strconv.Itoa(rec.code)).Inc()
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"cannot encode response"}`)
	}
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
	_, _ = w.Write([]byte{'\n'})
}

func writeError(w http.ResponseWriter, e *APIError) {
	writeJSON(w, e.Status, e)
}

// userID is the caller's identity. This example trusts the X-User-ID
// header as set by an authenticating gateway; a real service would take it
// from a verified token.
func userID(r *http.Request) (string, *APIError) {
	u := r.Header.Get(HeaderUserID)
	switch {
	case u == "":
		return "", &APIError{Status: http.StatusUnauthorized, Field: HeaderUserID, Message: "header is required on writes: it names the calling user"}
	case len(u) > MaxUserIDBytes:
		return "", &APIError{Status: http.StatusBadRequest, Field: HeaderUserID, Message: fmt.Sprintf("header is longer than %d bytes", MaxUserIDBytes)}
	}
	return u, nil
}
