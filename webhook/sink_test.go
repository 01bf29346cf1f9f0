package webhook_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// scripted is a receiver that answers its n-th request with answers[n]
// (the last answer repeats) and keeps every request.
type scripted struct {
	*httptest.Server
	mu      sync.Mutex
	reqs    []*http.Request
	bodies  [][]byte
	times   []time.Time
	answers []func(w http.ResponseWriter)
}

func newScripted(t *testing.T, answers ...func(w http.ResponseWriter)) *scripted {
	t.Helper()
	s := &scripted{answers: answers}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.reqs)
		s.reqs = append(s.reqs, r)
		s.bodies = append(s.bodies, body)
		s.times = append(s.times, time.Now())
		s.mu.Unlock()
		s.answers[min(n, len(s.answers)-1)](w)
	}))
	t.Cleanup(func() { s.CloseClientConnections(); s.Close() })
	return s
}

func (s *scripted) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

func status(code int, header ...string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte(http.StatusText(code)))
	}
}

func hang(d time.Duration) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) { time.Sleep(d); w.WriteHeader(http.StatusOK) }
}

func TestWebhookDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a message is posted once, signed, with its dedupe key as Idempotency-Key", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, status(204))
		e.run(t, destination("orders", rcv.URL, false))
		e.send(t, "orders", "order-1-paid", `{"order":1,"text":"paid"}`)
		d := e.waitState(t, "orders", "order-1-paid", webhook.StateDelivered)
		if d.Attempts != 1 || d.LastStatus == nil || *d.LastStatus != 204 {
			t.Fatalf("want one attempt answered 204, got %+v", d)
		}
		r, body := rcv.reqs[0], rcv.bodies[0]
		if got := r.Header.Get("Idempotency-Key"); got != "order-1-paid" {
			t.Fatalf("Idempotency-Key = %q", got)
		}
		var payload map[string]any
		if err := json.Unmarshal(body, &payload); err != nil || payload["text"] != "paid" {
			t.Fatalf("body %s is not the payload: %v", body, err)
		}
		if err := webhook.Verify(secret, r.Header, body, time.Now(), 0); err != nil {
			t.Fatalf("the receiver's secret does not verify the request: %v", err)
		}
		tampered := []byte(strings.Replace(string(body), "paid", "refunded", 1))
		if err := webhook.Verify(secret, r.Header, tampered, time.Now(), 0); err != webhook.ErrSignature {
			t.Fatalf("a tampered body verified: %v", err)
		}
		if err := webhook.Verify([]byte("another secret"), r.Header, body, time.Now(), 0); err != webhook.ErrSignature {
			t.Fatalf("another secret verified: %v", err)
		}
		if err := webhook.Verify(secret, r.Header, body, time.Now().Add(time.Hour), 0); err == nil {
			t.Fatal("a request an hour old verified")
		}
	})

	t.Run("duplicate appends of one dedupe key are delivered once", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, status(200))
		first := e.send(t, "orders", "k", `{"n":1}`)
		second := e.send(t, "orders", "k", `{"n":2}`)
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT "`+e.schema+`".append_message('orders', 'k', '{"n":3}')`); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		e.run(t, destination("orders", rcv.URL, false))
		d := e.waitState(t, "orders", "k", webhook.StateDelivered)
		schematest.Eventually(t, 10*time.Second, "both duplicates recorded", func() bool { return e.delivery(t, "orders", "k").Duplicates == 2 })
		if rcv.count() != 1 || d.EventID != first || second == first {
			t.Fatalf("want one request for message %d, got %d requests, owner %d", first, rcv.count(), d.EventID)
		}
		if !strings.Contains(string(rcv.bodies[0]), `"n": 1`) && !strings.Contains(string(rcv.bodies[0]), `"n":1`) {
			t.Fatalf("the first message's payload was not the one sent: %s", rcv.bodies[0])
		}
	})

	t.Run("an ineligible message is skipped without a request", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, status(200))
		if _, err := e.pool.Exec(ctx, `CREATE TABLE "`+e.schema+`".orders (id int PRIMARY KEY, cancelled bool NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".orders VALUES (1, false), (2, true)`); err != nil {
			t.Fatal(err)
		}
		d := destination("orders", rcv.URL, false)
		d.Check = `SELECT NOT cancelled FROM "` + e.schema + `".orders WHERE id = ($2::jsonb->>'order')::int AND $1 <> ''`
		e.run(t, d)
		e.send(t, "orders", "o2", `{"order":2}`)
		e.send(t, "orders", "o1", `{"order":1}`)
		e.send(t, "orders", "o3", `{"order":3}`) // no row: not eligible either
		e.waitState(t, "orders", "o1", webhook.StateDelivered)
		skipped := e.waitState(t, "orders", "o2", webhook.StateSkipped)
		e.waitState(t, "orders", "o3", webhook.StateSkipped)
		if rcv.count() != 1 || skipped.Attempts != 0 || !strings.Contains(skipped.LastError, "check returned false") {
			t.Fatalf("want only o1 sent and o2 skipped with the reason; %d requests, o2 %+v", rcv.count(), skipped)
		}
	})

	t.Run("a 4xx answer fails the message without a retry", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, status(422))
		e.run(t, destination("orders", rcv.URL, false))
		e.send(t, "orders", "k", `{}`)
		d := e.waitState(t, "orders", "k", webhook.StateFailed)
		time.Sleep(100 * time.Millisecond)
		if rcv.count() != 1 || !strings.Contains(d.LastError, "HTTP 422") {
			t.Fatalf("want one request and the reason, got %d requests, %+v", rcv.count(), d)
		}
	})

	t.Run("500 and 429 are retried with retry_5xx, at least Retry-After apart, then delivered", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, status(500), status(429, "Retry-After", "1"), status(503), status(200))
		dest := destination("orders", rcv.URL, false)
		dest.Retry5xx = true
		e.run(t, dest)
		e.send(t, "orders", "k", `{}`)
		d := e.waitState(t, "orders", "k", webhook.StateDelivered)
		if d.Attempts != 4 || rcv.count() != 4 {
			t.Fatalf("want 4 attempts, got %d (requests %d)", d.Attempts, rcv.count())
		}
		if gap := rcv.times[2].Sub(rcv.times[1]); gap < time.Second {
			t.Fatalf("the retry after Retry-After: 1 came %s later", gap)
		}
	})

	t.Run("retries that run out fail the message with the last reason", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, status(502))
		d := destination("orders", rcv.URL, false)
		d.Retry5xx = true
		d.MaxAttempts = 3
		e.run(t, d)
		e.send(t, "orders", "k", `{}`)
		got := e.waitState(t, "orders", "k", webhook.StateFailed)
		if got.Attempts != 3 || !strings.Contains(got.LastError, "gave up after 3 attempts: HTTP 502") {
			t.Fatalf("got %+v", got)
		}
	})

	t.Run("a refused connection is retried until the receiver is up", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // nothing listens: connection refused
		e.run(t, destination("orders", "http://"+addr+"/hook", false))
		e.send(t, "orders", "k", `{}`)
		schematest.Eventually(t, 10*time.Second, "a refused attempt recorded", func() bool {
			return strings.Contains(e.delivery(t, "orders", "k").LastError, "request not sent")
		})
		// The claim before each try counts its attempt and a refused try
		// gives it back, so a read between a refusal and the next claim
		// sees 0 and one during a try 1; never more.
		if d := e.delivery(t, "orders", "k"); d.Attempts > 1 || d.State != webhook.StateReserved {
			t.Fatalf("refused attempts charged the message: %+v; want at most the try in flight, still reserved", d)
		}
		l, err = net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })}
		go srv.Serve(l)
		defer srv.Close()
		d := e.waitState(t, "orders", "k", webhook.StateDelivered)
		if d.Uncertain || d.Attempts != 1 {
			t.Fatalf("a refused connection made the outcome uncertain, or was charged: %+v; want 1 attempt, certain", d)
		}
	})

	t.Run("a timeout after sending parks the message as unknown when the receiver is not idempotent", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, hang(time.Second), status(200))
		e.run(t, destination("orders", rcv.URL, false))
		e.send(t, "orders", "k", `{}`)
		d := e.waitState(t, "orders", "k", webhook.StateUnknown)
		time.Sleep(300 * time.Millisecond)
		if rcv.count() != 1 || !d.Uncertain {
			t.Fatalf("want one request and an uncertain unknown, got %d requests, %+v", rcv.count(), d)
		}
	})

	t.Run("a timeout after sending is retried with the same key when the receiver is idempotent", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, hang(time.Second), status(200))
		e.run(t, destination("orders", rcv.URL, true))
		e.send(t, "orders", "k", `{}`)
		e.waitState(t, "orders", "k", webhook.StateDelivered)
		if rcv.count() != 2 || rcv.reqs[1].Header.Get("Idempotency-Key") != "k" {
			t.Fatalf("want a second request with the same key, got %d", rcv.count())
		}
	})

	t.Run("a message for an unconfigured destination waits with the reason, and is sent once a relay serves it", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, status(200))
		stop := e.run(t, destination("orders", rcv.URL, false))
		e.send(t, "billing", "k", `{"x":1}`)
		d := e.waitState(t, "billing", "k", webhook.StateWaiting)
		if !strings.Contains(d.LastError, `no live relay serves destination "billing"`) {
			t.Fatalf("reason: %q", d.LastError)
		}
		stop()
		e.run(t, destination("orders", rcv.URL, false), destination("billing", rcv.URL, false))
		e.waitState(t, "billing", "k", webhook.StateDelivered)
		if rcv.count() != 1 {
			t.Fatalf("want one request, got %d", rcv.count())
		}
	})

	t.Run("a request in flight when the relay died makes a non-idempotent message unknown, never re-sent", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, status(200))
		id := e.send(t, "orders", "k", `{}`)
		// The ledger as a relay killed between claim and answer leaves it.
		if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".deliveries (destination, dedupe_key, event_id, payload, attempts, in_flight)
			VALUES ('orders', 'k', $1, '{}', 1, true)`, id); err != nil {
			t.Fatal(err)
		}
		e.run(t, destination("orders", rcv.URL, false))
		d := e.waitState(t, "orders", "k", webhook.StateUnknown)
		if rcv.count() != 0 || !strings.Contains(d.LastError, "in flight") {
			t.Fatalf("want no request and the reason, got %d requests, %+v", rcv.count(), d)
		}
		unknown, err := webhook.List(ctx, e.pool, e.schema, webhook.Filter{State: webhook.StateUnknown})
		if err != nil || len(unknown) != 1 {
			t.Fatalf("list --state unknown: %v %v", unknown, err)
		}
	})

	t.Run("a destination's rate and concurrency limits hold", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		var mu sync.Mutex
		inFlight, most := 0, 0
		rcv := newScripted(t, func(w http.ResponseWriter) {
			mu.Lock()
			inFlight++
			most = max(most, inFlight)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			inFlight--
			mu.Unlock()
		})
		d := destination("orders", rcv.URL, false)
		d.Rate, d.Concurrency = 20, 2
		e.run(t, d)
		for i := range 21 {
			e.send(t, "orders", "k"+string(rune('a'+i)), `{}`)
		}
		schematest.Eventually(t, 20*time.Second, "all delivered", func() bool { return rcv.count() == 21 })
		rcv.mu.Lock()
		span := rcv.times[20].Sub(rcv.times[0])
		rcv.mu.Unlock()
		mu.Lock() // the last handler may still be running
		peak := most
		mu.Unlock()
		// Arrival times carry each request's own delay (claim, connection) on
		// top of the limiter's 50 ms slots; unlimited, 21 requests at 2 at once
		// take about 210 ms.
		if span < 700*time.Millisecond || peak > 2 {
			t.Fatalf("21 requests at 20/s took %s (want >= 1s), %d at once (want <= 2)", span, peak)
		}
	})

	t.Run("a dead destination delays neither another destination nor the search stream", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		dead := newScripted(t, hang(2*time.Second))
		live := newScripted(t, status(200))
		slow := destination("slow", dead.URL, true)
		slow.Concurrency = 1
		ss, err := streams(e.pool, e.schema, slow, destination("fast", live.URL, false))
		if err != nil {
			t.Fatal(err)
		}
		search := &searchSink{seen: map[int64]bool{}}
		ss = append(ss, relay.Stream{Name: "search", BucketHi: 1023, Exclude: []string{outbox.MessagePrefix + "*"}, Sink: search})
		start(t, relayConfig(e.pool, e.schema, ss))
		for i := range 20 {
			e.send(t, "slow", "s"+string(rune('a'+i)), `{}`)
		}
		id, err := e.outbox.Append(ctx, e.pool, outbox.Event{IndexName: "tutorials", SourceID: "1", Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		e.send(t, "fast", "f", `{}`)
		began := time.Now()
		e.waitState(t, "fast", "f", webhook.StateDelivered)
		schematest.Eventually(t, 5*time.Second, "the search event delivered", func() bool { return search.has(id) })
		if took := time.Since(began); took > 2*time.Second {
			t.Fatalf("took %s with a dead destination", took)
		}
		if search.count() != 1 {
			t.Fatalf("the search stream saw %d events; messages must not reach it", search.count())
		}
	})
}

type searchSink struct {
	mu   sync.Mutex
	seen map[int64]bool
}

func (s *searchSink) Write(_ context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	outs := make([]outbox.Outcome, len(events))
	for i, e := range events {
		s.seen[e.ID] = true
		outs[i] = outbox.Outcome{Status: outbox.Applied}
	}
	return outs, nil
}

func (s *searchSink) has(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[id]
}

func (s *searchSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}
