package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// recordingSink remembers every event it is given and answers with a
// programmable outcome.
type recordingSink struct {
	mu      sync.Mutex
	seen    []outbox.Event
	count   map[int64]int
	outcome func(e outbox.Event) outbox.Outcome // nil: Applied
	down    bool                                // Write fails as a whole
	writes  int
}

func newRecordingSink() *recordingSink { return &recordingSink{count: map[int64]int{}} }

func (s *recordingSink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	if s.down {
		return nil, fmt.Errorf("sink is down")
	}
	outs := make([]outbox.Outcome, len(events))
	for i, e := range events {
		o := outbox.Outcome{Status: outbox.Applied}
		if s.outcome != nil {
			o = s.outcome(e)
		}
		outs[i] = o
		if o.Status == outbox.Applied || o.Status == outbox.Stale {
			s.seen = append(s.seen, e)
			s.count[e.ID]++
		}
	}
	return outs, nil
}

func (s *recordingSink) setDown(v bool) {
	s.mu.Lock()
	s.down = v
	s.mu.Unlock()
}

func (s *recordingSink) has(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count[id] > 0
}

func (s *recordingSink) delivered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.count)
}

type env struct {
	pool   *pgxpool.Pool
	schema string
	outbox *outbox.Outbox
}

func setup(t *testing.T) *env {
	t.Helper()
	pool, name := schematest.Setup(t)
	ob, err := outbox.NewOutbox(name)
	if err != nil {
		t.Fatal(err)
	}
	return &env{pool: pool, schema: name, outbox: ob}
}

func (e *env) config(sink relay.Sink) relay.Config {
	return relay.Config{
		Pool:            e.pool,
		Schema:          e.schema,
		Sink:            sink,
		MaxPollInterval: 20 * time.Millisecond,
		BackoffBase:     5 * time.Millisecond,
		BackoffMax:      50 * time.Millisecond,
		LeaseInterval:   100 * time.Millisecond,
		Registerer:      prometheus.NewRegistry(),
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// start runs a relay until the test ends and returns a stop function that
// shuts it down gracefully and returns Run's error.
func start(t *testing.T, cfg relay.Config) (stop func() error) {
	t.Helper()
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(30 * time.Second):
				runErr = fmt.Errorf("relay did not stop within 30s")
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func (e *env) append(t *testing.T, n int) []int64 {
	t.Helper()
	ids := make([]int64, n)
	for i := range n {
		id, err := e.outbox.Append(context.Background(), e.pool, outbox.Event{
			IndexName: "items", SourceID: fmt.Sprintf("s%d", i), Version: 1, Op: outbox.OpUpsert,
			Document: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
		})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	return ids
}

func (e *env) backlog(t *testing.T) int64 {
	t.Helper()
	st, err := relay.CollectStats(context.Background(), e.pool, e.schema)
	if err != nil {
		t.Fatal(err)
	}
	return st.Backlog()
}

func TestRelayDelivery(t *testing.T) {
	t.Parallel()

	t.Run("every committed event is delivered and acknowledged", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		stop := start(t, e.config(sink))
		ids := e.append(t, 500)
		schematest.Eventually(t, 20*time.Second, "all events delivered", func() bool { return sink.delivered() == len(ids) })
		schematest.Eventually(t, 20*time.Second, "backlog zero", func() bool { return e.backlog(t) == 0 })
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	})

	t.Run("a transaction that commits late is delivered after a later id", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		start(t, e.config(sink))
		ctx := context.Background()

		txA, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer txA.Rollback(ctx)
		idA, err := e.outbox.Append(ctx, txA, outbox.Event{IndexName: "items", SourceID: "a", Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		idB, err := e.outbox.Append(ctx, e.pool, outbox.Event{IndexName: "items", SourceID: "b", Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if idB <= idA {
			t.Fatalf("want B's id after A's: %d <= %d", idB, idA)
		}
		schematest.Eventually(t, 10*time.Second, "B delivered while A is open", func() bool { return sink.has(idB) })
		// Let the relay take several more snapshots past B before A commits.
		time.Sleep(200 * time.Millisecond)
		if sink.has(idA) {
			t.Fatal("A was delivered before it committed")
		}
		if err := txA.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		schematest.Eventually(t, 10*time.Second, "A delivered after it commits", func() bool { return sink.has(idA) })
	})

	t.Run("a long unrelated open write transaction does not stall delivery", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		start(t, e.config(sink))
		ctx := context.Background()

		long, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer long.Rollback(ctx)
		// An xid assigned and held: the classic watermark stall.
		if _, err := long.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
			t.Fatal(err)
		}
		for round := range 5 {
			ids := e.append(t, 20)
			schematest.Eventually(t, 10*time.Second, fmt.Sprintf("round %d delivered with the long transaction open", round), func() bool {
				return sink.has(ids[len(ids)-1]) && sink.has(ids[0])
			})
		}
	})

	t.Run("rolled back events are never delivered", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		start(t, e.config(sink))
		ctx := context.Background()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		idR, err := e.outbox.Append(ctx, tx, outbox.Event{IndexName: "items", SourceID: "r", Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		ids := e.append(t, 3)
		schematest.Eventually(t, 10*time.Second, "later events delivered", func() bool { return sink.has(ids[2]) })
		if sink.has(idR) {
			t.Fatal("a rolled back event was delivered")
		}
	})
}

func TestRelayWakeup(t *testing.T) {
	t.Parallel()

	t.Run("an idle relay wakes on the outbox's notification instead of waiting out its poll interval", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := context.Background()
		if _, err := e.pool.Exec(ctx, `SELECT "`+e.schema+`".enable_wakeup()`); err != nil {
			t.Fatal(err)
		}
		sink := newRecordingSink()
		cfg := e.config(sink)
		cfg.Wakeup = true
		cfg.MinPollInterval = time.Minute
		cfg.MaxPollInterval = time.Minute
		start(t, cfg)
		first := e.append(t, 1)
		// The very first poll happens at once; after it the loop sleeps a minute.
		schematest.Eventually(t, 10*time.Second, "first event", func() bool { return sink.has(first[0]) })
		time.Sleep(100 * time.Millisecond)
		for i := range 3 {
			id, err := e.outbox.Append(ctx, e.pool, outbox.Event{IndexName: "items", SourceID: fmt.Sprintf("wake%d", i), Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			schematest.Eventually(t, 5*time.Second, "woken delivery", func() bool { return sink.has(id) })
		}
	})
}
