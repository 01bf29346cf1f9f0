package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay/relaytest"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// TestConformance runs the sink conformance suite against a loopback
// receiver and the real PostgreSQL ledger, each behind a TCP proxy: the
// receiver's can stall requests (held and lost: the client times out)
// or refuse connections, the ledger's refuse connections. The receiver
// counts the requests it gets per dedupe key, the effect the suite
// observes. The destination is idempotent: a request whose answer is
// lost is sent again under its key, so a cancelled Write leaves no
// message unknown.
//
// A receiver that refuses connections is the destination's outage: its
// attempts are not charged and the messages go back to the relay.
func TestConformance(t *testing.T) {
	t.Parallel()
	relaytest.Exercise(t, func(t *testing.T) relaytest.Harness {
		e := setup(t)
		rcv := newCountingReceiver(t)
		rcvProxy := relaytest.NewProxy(t, rcv.Listener.Addr().String())
		pgProxy, ledger := proxiedPool(t)
		d := webhook.Destination{
			Name: "conformance", URL: "http://" + rcvProxy.Addr() + "/hook", Secret: secret, Idempotent: true,
			Timeout: 2 * time.Second, Concurrency: 8,
			MaxAttempts: 3, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		}
		s := e.sink(t, ledger, d, webhook.Options{})
		var fakeID atomic.Int64
		fakeID.Store(1 << 40)
		return relaytest.Harness{
			Sink: s,
			Event: func(t *testing.T, key string, rev int) outbox.Event {
				payload := fmt.Sprintf(`{"key":%q,"rev":%d}`, key, rev)
				return message(e.send(t, d.Name, key, payload), d.Name, key, payload)
			},
			Bad: func(t *testing.T, key string) outbox.Event {
				// Written before the schema refused such payloads: the
				// sink can never deliver it.
				return message(fakeID.Add(1), d.Name, key, `["not", "an", "object"]`)
			},
			Observe: func(t *testing.T, key string) relaytest.Effect { return rcv.effect(key) },
			Outages: []relaytest.Outage{
				{Name: "the ledger's PostgreSQL refuses connections", Begin: func(*testing.T) func() { return pgProxy.Cut() }},
				{Name: "the receiver refuses connections", Begin: func(*testing.T) func() { return rcvProxy.Cut() }},
			},
			Stall: func(*testing.T) (<-chan struct{}, func()) { return rcvProxy.Stall() },
			// Requests in flight run to their own timeout, so that their
			// outcome is known.
			CancelBound: d.Timeout + 3*time.Second,
		}
	})
}

// proxiedPool returns a pool to the test's PostgreSQL whose connections
// all go through a proxy.
func proxiedPool(t *testing.T) (*relaytest.Proxy, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(schematest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err) // pgx's parse errors do not quote the password
	}
	p := relaytest.NewProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(p.Addr())
	n, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(n), nil
	cfg.MaxConns = 8
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return p, pool
}

// countingReceiver verifies each request's signature, counts the requests
// per dedupe key and keeps the rev of the last payload.
type countingReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	requests map[string]int
	rev      map[string]int
}

func newCountingReceiver(t *testing.T) *countingReceiver {
	t.Helper()
	r := &countingReceiver{requests: map[string]int{}, rev: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		if err := webhook.Verify(secret, req.Header, body, time.Now(), 0); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var p struct {
			Rev int `json:"rev"`
		}
		_ = json.Unmarshal(body, &p)
		key := req.Header.Get(webhook.HeaderID)
		r.mu.Lock()
		r.requests[key]++
		r.rev[key] = p.Rev
		r.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(func() { r.CloseClientConnections(); r.Close() })
	return r
}

func (r *countingReceiver) effect(key string) relaytest.Effect {
	r.mu.Lock()
	defer r.mu.Unlock()
	return relaytest.Effect{Writes: r.requests[key], Rev: r.rev[key]}
}
