package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/relay/relaytest"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

var (
	_ relay.Sink       = (*webhook.Sink)(nil)
	_ relay.LeaderWork = (*webhook.Sink)(nil)
	_ relay.Sink       = (*webhook.UnroutedSink)(nil)
)

var secret = []byte("test-secret-0123456789")

type env struct {
	pool   *pgxpool.Pool
	schema string
	outbox *outbox.Outbox
}

func setup(t testing.TB) *env {
	t.Helper()
	pool, name := schematest.Setup(t)
	ob, err := outbox.NewOutbox(name)
	if err != nil {
		t.Fatal(err)
	}
	return &env{pool: pool, schema: name, outbox: ob}
}

func (e *env) send(t *testing.T, dest, key, payload string) int64 {
	t.Helper()
	id, err := e.outbox.AppendMessage(context.Background(), e.pool, outbox.Message{Destination: dest, DedupeKey: key, Payload: json.RawMessage(payload)})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (e *env) delivery(t *testing.T, dest, key string) webhook.Delivery {
	t.Helper()
	ds, err := webhook.List(context.Background(), e.pool, e.schema, webhook.Filter{Destination: dest, Limit: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.DedupeKey == key {
			return d
		}
	}
	return webhook.Delivery{}
}

// waitState waits until the message's ledger row reaches state.
func (e *env) waitState(t *testing.T, dest, key, state string) webhook.Delivery {
	t.Helper()
	var d webhook.Delivery
	schematest.Eventually(t, 20*time.Second, fmt.Sprintf("%s/%s is %s", dest, key, state), func() bool {
		d = e.delivery(t, dest, key)
		return d.State == state
	})
	return d
}

// waitUnsent waits until dest/key records an attempt that never reached
// its receiver: the message stays reserved, charged no attempt.
func (e *env) waitUnsent(t *testing.T, dest, key string) webhook.Delivery {
	t.Helper()
	var d webhook.Delivery
	schematest.Eventually(t, 20*time.Second, fmt.Sprintf("%s/%s records a request not sent", dest, key), func() bool {
		d = e.delivery(t, dest, key)
		// Between a claim and its answer the row shows attempts 1. The
		// unrouted stream may record the message as waiting before the
		// destination's own stream reads it and takes the row over: not
		// yet an answer either.
		return strings.Contains(d.LastError, "request not sent") && d.Attempts == 0 ||
			(d.State != webhook.StateReserved && d.State != webhook.StateWaiting && d.State != "")
	})
	if d.State != webhook.StateReserved || d.Attempts != 0 {
		t.Fatalf("%s/%s: %s after %d attempts; a request that never reached the receiver must charge none and fail nothing", dest, key, d.State, d.Attempts)
	}
	return d
}

// destination is a test destination with fast retries.
func destination(name, url string, idempotent bool) webhook.Destination {
	return webhook.Destination{
		Name: name, URL: url, Secret: secret, Idempotent: idempotent,
		Timeout: 300 * time.Millisecond, Concurrency: 8, MaxAttempts: 100,
		BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
	}
}

// streams gives each destination its own stream and sink, and the rest of
// the message namespace to the unrouted sink: what outboxd relay builds.
func streams(pool *pgxpool.Pool, schemaName string, dests ...webhook.Destination) ([]relay.Stream, error) {
	var out []relay.Stream
	var names []string
	for _, d := range dests {
		s, err := webhook.NewSink(webhook.Options{Pool: pool, Schema: schemaName, Destination: d})
		if err != nil {
			return nil, err
		}
		out = append(out, relay.Stream{Name: "webhook-" + d.Name, BucketHi: 1023, Indexes: []string{outbox.MessageIndex(d.Name)}, Sink: s})
		names = append(names, d.Name)
	}
	unrouted, err := webhook.NewUnroutedSink(pool, schemaName, names, nil)
	if err != nil {
		return nil, err
	}
	return append(out, relay.Stream{Name: "webhook-unrouted", BucketHi: 1023, Indexes: []string{outbox.MessagePrefix + "*"}, Sink: unrouted}), nil
}

// run starts a relay in this process for dests.
func (e *env) run(t *testing.T, dests ...webhook.Destination) (stop func()) {
	t.Helper()
	ss, err := streams(e.pool, e.schema, dests...)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, relayConfig(e.pool, e.schema, ss))
}

func relayConfig(pool *pgxpool.Pool, schemaName string, ss []relay.Stream) relay.Config {
	return relay.Config{
		Pool: pool, Schema: schemaName, Streams: ss,
		MaxBatchDocs: 500, MaxPollInterval: 20 * time.Millisecond, LeaseInterval: 100 * time.Millisecond,
		BackoffBase: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		Registerer: prometheus.NewRegistry(),
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// start runs a relay in this process until stop or the test's end.
func start(t testing.TB, cfg relay.Config) (stop func()) {
	t.Helper()
	return relaytest.Start(t, cfg)
}

// faults are the receiver's misbehaviours, as probabilities per request.
type faults struct {
	err500, err429    float64 // answered before any effect
	hang, cutHeaders  float64 // after the effect: no answer in time, or the connection closed mid-response
	cutBody           float64 // after the effect: status 200 sent, then the connection closed mid-body
	drop              float64 // after the effect: the connection closed without a byte of answer
	hangFor           time.Duration
	retryAfterSeconds int
}

// receiver is a webhook endpoint on loopback that verifies signatures and
// counts effects per Idempotency-Key. An idempotent receiver applies a key
// once; the other applies every request it accepts.
type receiver struct {
	*httptest.Server
	idempotent bool
	faults     faults

	mu        sync.Mutex
	requests  map[string]int
	effects   map[string]int
	bodies    map[string]string
	badSigs   int
	hangs     sync.WaitGroup
	stopHangs chan struct{}
}

func newReceiver(t *testing.T, idempotent bool, f faults) *receiver {
	t.Helper()
	r := &receiver{idempotent: idempotent, faults: f, requests: map[string]int{}, effects: map[string]int{}, bodies: map[string]string{}, stopHangs: make(chan struct{})}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		close(r.stopHangs)
		r.Server.CloseClientConnections()
		r.Server.Close()
	})
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	if err := webhook.Verify(secret, req.Header, body, time.Now(), 0); err != nil {
		r.mu.Lock()
		r.badSigs++
		r.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	key := req.Header.Get("Idempotency-Key")
	f := r.faults
	p := rand.Float64()
	r.mu.Lock()
	r.requests[key]++
	switch {
	case p < f.err500:
		r.mu.Unlock()
		http.Error(w, "flaky", http.StatusInternalServerError)
		return
	case p < f.err500+f.err429:
		r.mu.Unlock()
		w.Header().Set("Retry-After", strconv.Itoa(f.retryAfterSeconds))
		http.Error(w, "slow down", http.StatusTooManyRequests)
		return
	}
	if !r.idempotent || r.effects[key] == 0 {
		r.effects[key]++
		r.bodies[key] = string(body)
	}
	r.mu.Unlock()
	p = rand.Float64()
	switch {
	case p < f.hang:
		select {
		case <-time.After(f.hangFor):
		case <-r.stopHangs:
		}
	case p < f.hang+f.cutHeaders:
		cut(w, "HTTP/1.1 20")
		return
	case p < f.hang+f.cutHeaders+f.cutBody:
		cut(w, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"ok\":")
		return
	case p < f.hang+f.cutHeaders+f.cutBody+f.drop:
		cut(w, "")
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(`{"ok":true}`))
}

// cut writes raw bytes and closes the connection.
func cut(w http.ResponseWriter, raw string) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	_, _ = buf.WriteString(raw)
	_ = buf.Flush()
	_ = conn.Close()
}

func (r *receiver) counts(key string) (requests, effects int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[key], r.effects[key]
}

func (r *receiver) snapshot() (requests, effects map[string]int, badSigs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	requests, effects = map[string]int{}, map[string]int{}
	for k, v := range r.requests {
		requests[k] = v
	}
	for k, v := range r.effects {
		effects[k] = v
	}
	return requests, effects, r.badSigs
}

// childEnv makes this test binary run as a relay process (see TestMain),
// so that SIGKILL lands on a real process mid-request.
const childEnv = "OUTBOXD_WEBHOOK_CHILD"

type childSpec struct {
	Schema      string        `json:"schema"`
	URL         string        `json:"url"`
	Idempotent  bool          `json:"idempotent"`
	RetryInline time.Duration `json:"retry_inline"` // 0: the default
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	if spec := os.Getenv(proofChildEnv); spec != "" {
		os.Exit(runProofChild(spec))
	}
	os.Exit(m.Run())
}

func runChild(spec string) int {
	var c childSpec
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	d := destination("hook", c.URL, c.Idempotent)
	d.RetryInline = c.RetryInline
	return runRelayChild(ctx, pool, c.Schema, d)
}

// runRelayChild runs a relay for dests until ctx ends, as a child
// process's main: the exit code says how it ended.
func runRelayChild(ctx context.Context, pool *pgxpool.Pool, schemaName string, dests ...webhook.Destination) int {
	ss, err := streams(pool, schemaName, dests...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	r, err := relay.New(relayConfig(pool, schemaName, ss))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
