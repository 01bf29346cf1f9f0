package webhook_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

func (e *env) sink(t *testing.T, pool *pgxpool.Pool, d webhook.Destination, o webhook.Options) *webhook.Sink {
	t.Helper()
	o.Pool, o.Schema, o.Destination = pool, e.schema, d
	s, err := webhook.NewSink(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func message(id int64, dest, key, payload string) outbox.Event {
	return outbox.Event{ID: id, IndexName: outbox.MessageIndex(dest), SourceID: key, Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(payload)}
}

func write(t *testing.T, s *webhook.Sink, ev outbox.Event) outbox.Outcome {
	t.Helper()
	outs, err := s.Write(context.Background(), []outbox.Event{ev})
	if err != nil {
		t.Fatal(err)
	}
	return outs[0]
}

// blocking is a receiver whose requests apply the effect, announce
// themselves on arrived and wait for release before answering 200.
type blocking struct {
	*effectReceiver
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

// free lets every request waiting in the receiver, and every later one, answer.
func (b *blocking) free() { b.once.Do(func() { close(b.release) }) }

func newBlocking(t *testing.T) *blocking {
	b := &blocking{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	b.effectReceiver = newEffectReceiver(t, func(w http.ResponseWriter) {
		b.arrived <- struct{}{}
		select {
		case <-b.release:
		case <-time.After(10 * time.Second):
		}
		w.WriteHeader(200)
	})
	t.Cleanup(b.free)
	return b
}

// TestFailoverMidRequest: two ledger owners of one destination; the one
// whose request is in flight loses its PostgreSQL pool (its sessions
// end) mid-request. The other must not acknowledge the message while its
// row is reserved: it takes it over, and as the request may have been
// written, the message ends unknown with one effect.
func TestFailoverMidRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	rcv := newBlocking(t)
	poolA, err := pgxpool.New(ctx, schematest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	destA := destination("hook", rcv.URL, false)
	destA.Timeout = 8 * time.Second
	a := e.sink(t, poolA, destA, webhook.Options{})
	destB := destination("hook", rcv.URL, false)
	destB.CheckTimeout = 30 * time.Second
	destB.Check = `SELECT true FROM (SELECT pg_advisory_xact_lock_shared(4242)) l WHERE $1::text <> '' AND $2::jsonb IS NOT NULL`
	b := e.sink(t, e.pool, destB, webhook.Options{})

	lock, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	ev := message(e.send(t, "hook", "k", `{"n":1}`), "hook", "k", `{"n":1}`)
	bDone := make(chan outbox.Outcome, 1)
	go func() { bDone <- write(t, b, ev) }() // reserves, then waits in its check
	schematest.Eventually(t, 20*time.Second, "B waits in its check", func() bool {
		var n int
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted`).Scan(&n)
		return n > 0
	})
	aDone := make(chan struct{})
	go func() { defer close(aDone); write(t, a, ev) }() // claims and sends
	<-rcv.arrived
	poolA.Close() // A's sessions are gone while its request is in flight
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
		t.Fatal(err)
	}
	out := <-bDone
	d := e.delivery(t, "hook", "k")
	if d.State == webhook.StateReserved {
		t.Fatalf("B answered %s (%s) while the row is still reserved", out.Status, out.Reason)
	}
	if d.State != webhook.StateUnknown || rcv.count("k") != 1 {
		t.Fatalf("state %s with %d effects, want unknown with 1 (%s)", d.State, rcv.count("k"), d.LastError)
	}
	rcv.free()
	<-aDone
}

// TestFinishAfterTakeOver: an answer that comes back after another owner
// settled the row is not counted as the message's final state.
func TestFinishAfterTakeOver(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rcv := newBlocking(t)
	reg := prometheus.NewRegistry()
	a := e.sink(t, e.pool, destination("hook", rcv.URL, false), webhook.Options{Metrics: webhook.NewMetrics(reg)})
	b := e.sink(t, e.pool, destination("hook", rcv.URL, false), webhook.Options{})
	ev := message(e.send(t, "hook", "k", `{}`), "hook", "k", `{}`)
	aOut := make(chan outbox.Outcome, 1)
	go func() { aOut <- write(t, a, ev) }()
	<-rcv.arrived
	write(t, b, ev) // the row is in flight: B marks it unknown
	rcv.free()
	out := <-aOut
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "outboxd_webhook_messages_finished_total" {
			for _, m := range mf.GetMetric() {
				t.Errorf("A counted a final state %v = %v (outcome %s: %s)", m.GetLabel(), m.GetCounter().GetValue(), out.Status, out.Reason)
			}
		}
	}
	if d := e.delivery(t, "hook", "k"); d.State != webhook.StateUnknown {
		t.Fatalf("state %s, want unknown", d.State)
	}
}

// TestDedupeConflict: a second message with the key of the first but
// another payload is not sent, and is recorded and reported as a conflict:
// the row's conflicts, the outcome, the finished counter's state="conflict"
// and a WARN naming both event ids, as the README says.
func TestDedupeConflict(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rcv := newScripted(t, status(200))
	reg := prometheus.NewRegistry()
	var logs lockedBuffer
	s := e.sink(t, e.pool, destination("hook", rcv.URL, false), webhook.Options{
		Metrics: webhook.NewMetrics(reg), Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	first := e.send(t, "hook", "k", `{"amount":1}`)
	second := e.send(t, "hook", "k", `{"amount":2}`)
	same := e.send(t, "hook", "k", `{"amount":1}`)
	write(t, s, message(first, "hook", "k", `{"amount":1}`))
	out := write(t, s, message(second, "hook", "k", `{"amount":2}`))
	if !strings.Contains(out.Reason, "conflict") {
		t.Errorf("the conflicting message's outcome: %s %q", out.Status, out.Reason)
	}
	write(t, s, message(same, "hook", "k", `{"amount":1}`))
	var conflicts []int64
	if err := e.pool.QueryRow(context.Background(), `SELECT conflicts FROM "`+e.schema+`".deliveries WHERE dedupe_key = 'k'`).Scan(&conflicts); err != nil {
		t.Fatal(err)
	}
	if len(conflicts) != 1 || conflicts[0] != second || rcv.count() != 1 {
		t.Fatalf("conflicts %v, want [%d]; %d requests", conflicts, second, rcv.count())
	}
	for state, want := range map[string]float64{"conflict": 1, "duplicate": 1, "delivered": 1} {
		if got, _ := series(t, reg, "outboxd_webhook_messages_finished_total", "destination", "hook", "state", state); got != want {
			t.Errorf(`outboxd_webhook_messages_finished_total{state=%q} = %v, want %v`, state, got, want)
		}
	}
	warns := records(t, logs.String(), "different payload")
	if len(warns) != 1 {
		t.Fatalf("%d log records about the conflict, want 1:\n%s", len(warns), logs.String())
	}
	w := warns[0]
	if w["level"] != "WARN" || w["event_id"] != float64(second) || w["holder_event_id"] != float64(first) || w["dedupe_key"] != "k" {
		t.Fatalf("the conflict's log record %v: want a WARN with event_id %d, holder_event_id %d, dedupe_key k", w, second, first)
	}
}

// signalHandler calls on for every log record whose message contains sub.
type signalHandler struct {
	slog.Handler
	sub string
	on  func()
}

func (h signalHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.sub) {
		h.on()
	}
	return nil
}

// TestCheckTransientError: a check that fails with a serialization
// failure is run again, not the message failed for good.
func TestCheckTransientError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	rcv := newScripted(t, status(200))
	q := `"` + e.schema + `"`
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+q+`.gate (closed boolean);
		INSERT INTO `+q+`.gate VALUES (true);
		CREATE FUNCTION `+q+`.flaky(k text, p jsonb) RETURNS boolean LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (SELECT FROM `+q+`.gate) THEN
				RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001';
			END IF;
			RETURN true;
		END $$`); err != nil {
		t.Fatal(err)
	}
	d := destination("hook", rcv.URL, false)
	d.Check = `SELECT ` + q + `.flaky($1, $2::jsonb)`
	var once sync.Once
	log := slog.New(signalHandler{Handler: slog.DiscardHandler, sub: "running it again", on: func() {
		once.Do(func() { _, _ = e.pool.Exec(ctx, `DELETE FROM `+q+`.gate`) })
	}})
	s := e.sink(t, e.pool, d, webhook.Options{Logger: log})
	write(t, s, message(e.send(t, "hook", "k", `{}`), "hook", "k", `{}`))
	if got := e.delivery(t, "hook", "k"); got.State != webhook.StateDelivered || rcv.count() != 1 {
		t.Fatalf("state %s (%s), %d requests; want delivered once", got.State, got.LastError, rcv.count())
	}
}

// TestCheckValidatedAtStart: a check PostgreSQL cannot prepare, or one
// that does not use both parameters, is refused when the sink is made.
func TestCheckValidatedAtStart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for check, want := range map[string]string{
		`SELEC true`:             "syntax error",
		`SELECT $1::text <> ''`:  "both $1",
		`SELECT $2::jsonb ? 'x'`: "could not determine data type of parameter $1",
		`SELECT nosuch($1, $2)`:  "nosuch",
	} {
		d := destination("orders", "http://127.0.0.1:1", false)
		d.Check = check
		_, err := webhook.NewSink(webhook.Options{Pool: e.pool, Schema: e.schema, Destination: d})
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "destination orders") {
			t.Errorf("check %q: %v, want an error naming the destination and %q", check, err, want)
		}
	}
}

// TestCheckReadOnly: a check that writes fails the message and commits
// nothing.
func TestCheckReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	rcv := newScripted(t, status(200))
	q := `"` + e.schema + `"`
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+q+`.seen (k text)`); err != nil {
		t.Fatal(err)
	}
	d := destination("hook", rcv.URL, false)
	d.Check = `WITH w AS (INSERT INTO ` + q + `.seen VALUES ($1) RETURNING true) SELECT $2::jsonb IS NOT NULL FROM w`
	s := e.sink(t, e.pool, d, webhook.Options{})
	write(t, s, message(e.send(t, "hook", "k", `{}`), "hook", "k", `{}`))
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+q+`.seen`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if got := e.delivery(t, "hook", "k"); n != 0 || got.State != webhook.StateFailed || rcv.count() != 0 {
		t.Fatalf("%d rows written by the check, state %s, %d requests", n, got.State, rcv.count())
	}
}

// TestPoisonMessage: the schema refuses on the message namespace what
// append_message refuses, and a sink dead-letters an event it can never
// deliver (one written before the constraint existed).
func TestPoisonMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	q := `"` + e.schema + `"`
	_, err := e.pool.Exec(ctx, `INSERT INTO `+q+`.events (index_name, source_id, version, op) VALUES ('.outboxd-message.hook', 'k', 1, 'delete')`)
	if err == nil {
		t.Errorf("a delete on the message namespace was accepted")
	}
	rcv := newScripted(t, status(200))
	s := e.sink(t, e.pool, destination("hook", rcv.URL, false), webhook.Options{})
	ev := outbox.Event{ID: 1, IndexName: outbox.MessageIndex("hook"), SourceID: "k", Version: 1, Op: outbox.OpDelete}
	if out := write(t, s, ev); out.Status != outbox.Rejected {
		t.Fatalf("a delete message: %s %q, want rejected", out.Status, out.Reason)
	}
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }

// TestSlowCheckBudget: slow checks of many messages at once hold at most
// their share of the pool, so the search stream is not delayed.
func TestSlowCheckBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	rcv := newScripted(t, status(200))
	d := destination("slow", rcv.URL, false)
	d.Concurrency = 40
	d.Check = `SELECT true FROM pg_sleep(1) WHERE $1::text <> '' AND $2::jsonb IS NOT NULL`
	ss, err := streams(e.pool, e.schema, d)
	if err != nil {
		t.Fatal(err)
	}
	search := &searchSink{seen: map[int64]bool{}}
	ss = append(ss, relay.Stream{Name: "search", BucketHi: 1023, Exclude: []string{outbox.MessagePrefix + "*"}, Sink: search})
	start(t, relayConfig(e.pool, e.schema, ss))
	q := `"` + e.schema + `"`
	if _, err := e.pool.Exec(ctx, `SELECT `+q+`.append_message('slow', 'm' || g, '{}') FROM generate_series(1, 40) g`); err != nil {
		t.Fatal(err)
	}
	schematest.Eventually(t, 20*time.Second, "checks running", func() bool {
		var n int
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(1)%' AND state = 'active' AND pid <> pg_backend_pid()`).Scan(&n)
		return n > 0
	})
	id, err := e.outbox.Append(ctx, e.pool, outbox.Event{IndexName: "tutorials", SourceID: "1", Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	schematest.Eventually(t, 20*time.Second, "the search event delivered", func() bool { return search.has(id) })
	// An order, not a time: the 40 checks of 1 s each take several seconds
	// within their budget, and the search event must not wait for them.
	var still int
	_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(1)%' AND state = 'active' AND pid <> pg_backend_pid()`).Scan(&still)
	if still == 0 {
		t.Fatal("the search event was delivered only after the slow checks were done: they held its connections")
	}
}

type outboxEvent = outbox.Event

func writeAll(t *testing.T, s *webhook.Sink, events []outbox.Event) []outbox.Outcome {
	t.Helper()
	outs, err := s.Write(context.Background(), events)
	if err != nil {
		t.Fatal(err)
	}
	return outs
}

// TestPageWrittenTwiceAtOnce: a second Write of a page whose message is
// in flight in a first Write of the same sink must not read the ledger
// row as a request a stopped relay left in flight (which an idempotent
// destination sends again): it waits for the first and finds the message
// delivered. Before, the second request reached the receiver while the
// first was still held.
func TestPageWrittenTwiceAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rcv := newBlocking(t)
	d := destination("hook", rcv.URL, true)
	d.Timeout = 20 * time.Second
	s := e.sink(t, e.pool, d, webhook.Options{})
	ev := message(e.send(t, "hook", "k", `{"n":1}`), "hook", "k", `{"n":1}`)

	first := make(chan outbox.Outcome, 1)
	go func() { first <- write(t, s, ev) }()
	<-rcv.arrived // claimed and in flight, held by the receiver
	second := make(chan outbox.Outcome, 1)
	go func() { second <- write(t, s, ev) }()
	// The second Write has no request to make; one that arrives is the
	// defect. Nothing to wait for but the absence of a request.
	select {
	case <-rcv.arrived:
		rcv.free()
		t.Fatal("the second Write sent the message again while the first one's request was in flight")
	case <-time.After(2 * time.Second):
	}
	rcv.free()
	if o := <-first; o.Status != outbox.Applied {
		t.Errorf("first Write: %s (%s), want applied", o.Status, o.Reason)
	}
	if o := <-second; o.Status != outbox.Stale {
		t.Errorf("second Write: %s (%s), want stale (already delivered)", o.Status, o.Reason)
	}
	if n := rcv.count("k"); n != 1 {
		t.Errorf("the receiver got %d requests for k, want 1", n)
	}
}
