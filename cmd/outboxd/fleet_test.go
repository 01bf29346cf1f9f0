package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// Relays of one fleet with different --destination sets, in this process,
// wired as outboxd relay wires them (a search stream, the destinations'
// streams and the unrouted stream), against real PostgreSQL and loopback
// receivers.

const fleetSecretEnv = "OUTBOXD_FLEET_TEST_SECRET"

var fleetSecretOnce sync.Once

// hookReceiver answers 200 and counts requests per Idempotency-Key.
type hookReceiver struct {
	*httptest.Server
	mu   sync.Mutex
	keys map[string]int
}

func newHookReceiver(t *testing.T) *hookReceiver {
	t.Helper()
	h := &hookReceiver{keys: map[string]int{}}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h.mu.Lock()
		h.keys[r.Header.Get("Idempotency-Key")]++
		h.mu.Unlock()
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hookReceiver) requests(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.keys[key]
}

func (h *hookReceiver) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.keys {
		n += c
	}
	return n
}

func hookSpec(name, url string) string {
	fleetSecretOnce.Do(func() { os.Setenv(fleetSecretEnv, "whsec_ZmxlZXQtdGVzdC1zZWNyZXQ=") })
	return name + "=" + url + ",secret_env=" + fleetSecretEnv
}

type fleetRelay struct {
	r    *relay.Relay
	reg  *prometheus.Registry
	stop func()
}

// startFleetRelay runs one relay with the given --destination specs.
func startFleetRelay(t *testing.T, e *cliEnv, specs ...string) *fleetRelay {
	t.Helper()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	streams, err := relay.Partitions("default", 1)
	if err != nil {
		t.Fatal(err)
	}
	streams[0].Exclude = []string{outbox.MessagePrefix + "*"}
	hooks, err := messageStreams(e.pool, e.schema, specs, 0, 0, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Config{Pool: e.pool, Schema: e.schema, Sink: e.sink, Streams: append(streams, hooks...),
		LeaseInterval: 100 * time.Millisecond, MaxPollInterval: 20 * time.Millisecond,
		BackoffBase: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Registerer: reg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &fleetRelay{r: r, reg: reg, stop: stop}
}

func (e *cliEnv) message(t *testing.T, dest, key string) {
	t.Helper()
	if _, err := e.outbox.AppendMessage(context.Background(), e.pool, outbox.Message{Destination: dest, DedupeKey: key, Payload: json.RawMessage(`{"k":"` + key + `"}`)}); err != nil {
		t.Fatal(err)
	}
}

// ledgerStates counts a destination's ledger rows by state.
func (e *cliEnv) ledgerStates(t *testing.T, dest string) map[string]int {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT state, count(*)::int FROM "`+e.schema+`".deliveries WHERE destination = $1 GROUP BY state`, dest)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// streamsLed is how many of the named streams some session leads.
func (e *cliEnv) streamsLed(t *testing.T, names ...string) int {
	t.Helper()
	ls, err := relay.Leaders(context.Background(), e.pool, e.schema, names)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range ls {
		if l.PID != 0 {
			n++
		}
	}
	return n
}

// A relay started without any --destination still gives every message a
// ledger row (waiting: no relay serves its destination), so retention never
// deletes a message nobody recorded.
func TestRelayWithoutDestinationsRecordsEveryMessage(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	ctx := context.Background()
	fr := startFleetRelay(t, e)
	for i := range 5 {
		e.message(t, "billing", fmt.Sprint("k", i))
	}
	e.append(t, "search-docs", "doc-1", `{}`)
	schematest.Eventually(t, 20*time.Second, "the search event is applied", func() bool {
		e.sink.mu.Lock()
		defer e.sink.mu.Unlock()
		return e.sink.applied["doc-1"] == 1
	})
	schematest.Eventually(t, 20*time.Second, "every message has a waiting ledger row", func() bool {
		return e.ledgerStates(t, "billing")["waiting"] == 5
	})
	fr.stop()
	// Retention may now delete the messages (acknowledged by every stream):
	// the ledger keeps them, payload included.
	if _, err := relay.DeleteAcknowledged(ctx, e.pool, e.schema, 0, 100); err != nil {
		t.Fatal(err)
	}
	var left, withPayload int
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM "`+e.schema+`".events WHERE index_name = $1),
		(SELECT count(*) FROM "`+e.schema+`".deliveries WHERE destination = 'billing' AND payload ? 'k')`,
		outbox.MessageIndex("billing")).Scan(&left, &withPayload); err != nil {
		t.Fatal(err)
	}
	if left != 0 || withPayload != 5 {
		t.Fatalf("after retention: %d message events left (want 0), %d ledger rows with payload (want 5)", left, withPayload)
	}
}

// Relays with different destination sets (a rolling deploy that adds one):
// nothing is failed for want of configuration, the stream of a destination
// only one relay has is led by that relay, messages appended before any
// relay had the destination wait and are delivered once one has it, and a
// destination added later works the same way.
func TestRelaysWithDifferentDestinations(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	ctx := context.Background()
	ra, rb, rc := newHookReceiver(t), newHookReceiver(t), newHookReceiver(t)

	a := startFleetRelay(t, e, hookSpec("a", ra.URL))
	schematest.Eventually(t, 20*time.Second, "relay A leads its three streams", func() bool { return len(a.r.Leading()) == 3 })
	// Appended while no relay has destination b.
	for i := range 10 {
		e.message(t, "a", fmt.Sprint("early-a", i))
		e.message(t, "b", fmt.Sprint("early-b", i))
	}
	schematest.Eventually(t, 20*time.Second, "b's messages have ledger rows", func() bool {
		st := e.ledgerStates(t, "b")
		return st["waiting"]+st["failed"] == 10
	})
	if st := e.ledgerStates(t, "b"); st["failed"] != 0 {
		t.Fatalf("messages for a destination no relay serves yet were failed: %v", st)
	}

	b := startFleetRelay(t, e, hookSpec("a", ra.URL), hookSpec("b", rb.URL))
	all := []string{"default", "webhook-a", "webhook-b", "webhook-unrouted"}
	schematest.Eventually(t, 30*time.Second, "every stream has a leader and relay A shares the work", func() bool {
		return e.streamsLed(t, all...) == 4 && len(a.r.Leading()) > 0 && len(b.r.Leading()) > 0
	})
	for i := range 20 {
		e.message(t, "a", fmt.Sprint("a", i))
		e.message(t, "b", fmt.Sprint("b", i))
	}
	schematest.Eventually(t, 30*time.Second, "every message of a and b is delivered", func() bool {
		return e.ledgerStates(t, "a")["delivered"] == 30 && e.ledgerStates(t, "b")["delivered"] == 30
	})
	if got := rb.total(); got != 30 {
		t.Errorf("receiver b got %d requests, want 30 (one per key)", got)
	}
	if got := ra.total(); got != 30 {
		t.Errorf("receiver a got %d requests, want 30 (one per key)", got)
	}
	for _, s := range b.r.Leading() {
		if s == "webhook-b" {
			goto led
		}
	}
	t.Errorf("webhook-b is not led by the only relay that has it (B leads %v, A leads %v)", b.r.Leading(), a.r.Leading())
led:

	// A destination added later: its messages wait, visibly, until a relay
	// with it starts.
	for i := range 5 {
		e.message(t, "c", fmt.Sprint("c", i))
	}
	schematest.Eventually(t, 20*time.Second, "c's messages wait", func() bool { return e.ledgerStates(t, "c")["waiting"] == 5 })
	if body := gatherText(t, a.reg); !strings.Contains(body, `outboxd_webhook_waiting{destination="c"} 5`) {
		t.Errorf("metrics lack the waiting gauge:\n%s", grepLines(body, "waiting"))
	}
	ds, err := webhook.List(ctx, e.pool, e.schema, webhook.Filter{State: webhook.StateWaiting, Destination: "c"})
	if err != nil || len(ds) != 5 {
		t.Fatalf("deliveries list --state waiting: %d rows, %v", len(ds), err)
	}
	c := startFleetRelay(t, e, hookSpec("a", ra.URL), hookSpec("b", rb.URL), hookSpec("c", rc.URL))
	schematest.Eventually(t, 30*time.Second, "c's messages are delivered once a relay has c", func() bool {
		return e.ledgerStates(t, "c")["delivered"] == 5
	})
	for i := range 5 {
		if n := rc.requests(fmt.Sprint("c", i)); n != 1 {
			t.Errorf("c%d: %d requests, want 1", i, n)
		}
	}
	schematest.Eventually(t, 30*time.Second, "all five streams have a leader with three relays", func() bool {
		return e.streamsLed(t, append(all, "webhook-c")...) == 5
	})
	_ = c
}

// A waiting message whose event retention deleted before any relay had its
// destination is appended again by a relay that has it, and delivered.
func TestWaitingMessageOutlivesRetention(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	ctx := context.Background()
	rcv := newHookReceiver(t)
	first := startFleetRelay(t, e)
	e.message(t, "late", "k")
	schematest.Eventually(t, 20*time.Second, "the message waits", func() bool { return e.ledgerStates(t, "late")["waiting"] == 1 })
	// Deleted once every stream has stored a position past it; "waiting"
	// says only that the unrouted stream handled it.
	var deleted int64
	schematest.Eventually(t, 20*time.Second, "retention deletes the message's event", func() bool {
		n, err := relay.DeleteAcknowledged(ctx, e.pool, e.schema, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		deleted += n
		return deleted == 1
	})
	first.stop()
	if n, err := webhook.RequeueWaiting(ctx, e.pool, e.schema, []string{"late"}); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	startFleetRelay(t, e, hookSpec("late", rcv.URL))
	schematest.Eventually(t, 20*time.Second, "the message is delivered", func() bool { return e.ledgerStates(t, "late")["delivered"] == 1 })
	if n := rcv.requests("k"); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}

func gatherText(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			fmt.Fprintf(&b, "%s{%s} %g\n", mf.GetName(), strings.Join(labels, ","), v)
		}
	}
	return b.String()
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// /readyz of outboxd relay is not ready while one of its streams has no
// leader, and ready again once it has one. With the balancer a stream the
// relay can lead is never left unled for long; one that cannot go on while
// the relay runs (here its progress row went away) stops alone, unled,
// until it can be led again.
func TestReadyzNotReadyWhileAStreamHasNoLeader(t *testing.T) {
	// Not parallel: it sets the environment.
	e := cliSetup(t)
	ctx := context.Background()
	t.Setenv("ELASTICSEARCH_URL", schematest.ElasticsearchURL(t))
	addr := freeAddr(t)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- runRelay(rctx, append([]string{"--admin-addr", addr, "--lease-interval", "100ms", "--max-poll", "20ms", "--upgrade-layouts=false"}, e.dbArgs...))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const stream = "webhook-unrouted"
	leader := func() int {
		ls, err := relay.Leaders(ctx, e.pool, e.schema, []string{stream})
		if err != nil {
			t.Fatal(err)
		}
		return ls[0].PID
	}
	schematest.Eventually(t, 20*time.Second, "the relay leads both its streams", func() bool {
		return e.streamsLed(t, "default", stream) == 2
	})
	// What a stream meets in its first leadership stops the relay (a
	// configuration it cannot run); only later does it stop the stream
	// alone. So its session goes once first, and it is led again.
	first := leader()
	if _, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, first); err != nil {
		t.Fatal(err)
	}
	schematest.Eventually(t, 20*time.Second, "the stream is led again on a new session", func() bool {
		pid := leader()
		return pid != 0 && pid != first
	})
	q := func(sql string) {
		t.Helper()
		if _, err := e.pool.Exec(ctx, sql, stream); err != nil {
			t.Fatal(err)
		}
	}
	q(`CREATE TABLE "` + e.schema + `".saved_progress AS SELECT * FROM "` + e.schema + `".progress WHERE stream = $1`)
	q(`DELETE FROM "` + e.schema + `".progress WHERE stream = $1`)
	// A message for a destination no relay serves: the stream reads it and
	// must store its progress, which it cannot.
	if _, err := e.pool.Exec(ctx, `SELECT "`+e.schema+`".append_message('nobody', 'k', '{}')`); err != nil {
		t.Fatal(err)
	}
	var code int
	var body string
	schematest.Eventually(t, 20*time.Second, "/readyz is not ready, naming the stream without a leader", func() bool {
		code, body = readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "no relay leads stream "+stream)
	})
	q(`INSERT INTO "` + e.schema + `".progress SELECT * FROM "` + e.schema + `".saved_progress WHERE stream = $1`)
	schematest.Eventually(t, 20*time.Second, "/readyz is ready once the stream has a leader", func() bool {
		code, body = readyz()
		return code == http.StatusOK
	})
}
