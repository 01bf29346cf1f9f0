package relay_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// leaderPID is the backend holding the stream's lock, 0 when none.
func (e *env) leaderPID(t *testing.T, stream string) int {
	t.Helper()
	ls, err := relay.Leaders(context.Background(), e.pool, e.schema, []string{stream})
	if err != nil {
		t.Fatal(err)
	}
	return ls[0].PID
}

func (e *env) terminate(t *testing.T, pid int) {
	t.Helper()
	var ok bool
	if err := e.pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
	}
}

func TestRelayHeals(t *testing.T) {
	t.Parallel()

	t.Run("an idle leader whose session is killed says so within one lease interval and leads again", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		const lease = 400 * time.Millisecond
		cfg := e.config(newRecordingSink())
		cfg.LeaseInterval = lease
		reg := prometheus.NewRegistry()
		cfg.Registerer = reg
		r, err := relay.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		defer cancel()
		schematest.Eventually(t, 10*time.Second, "the relay leads", func() bool { return len(r.Leading()) == 1 })
		pid := e.leaderPID(t, "default")

		// Take the lock the moment the session is gone, so the relay
		// comes back as a standby and its report can be checked.
		conn, err := e.pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		e.terminate(t, pid)
		killed := time.Now()
		if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, relay.StreamKey(e.schema, "default")); err != nil {
			t.Fatal(err)
		}
		schematest.Eventually(t, 10*time.Second, "the relay gives up leadership", func() bool { return len(r.Leading()) == 0 })
		took := time.Since(killed)
		t.Logf("leadership given up %s after the session was killed (lease interval %s)", took.Round(time.Millisecond), lease)
		if took > lease+100*time.Millisecond {
			t.Fatalf("the relay called itself leader for %s after losing its lock", took)
		}
		if g := gaugeValue(t, reg, "outboxd_leader"); g != 0 {
			t.Fatalf("outboxd_leader = %v after losing the lock", g)
		}

		if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, relay.StreamKey(e.schema, "default")); err != nil {
			t.Fatal(err)
		}
		schematest.Eventually(t, 10*time.Second, "the relay leads again", func() bool { return len(r.Leading()) == 1 })
		ids := e.append(t, 3)
		schematest.Eventually(t, 10*time.Second, "it delivers", func() bool { return cfg.Sink.(*recordingSink).has(ids[2]) })
		select {
		case err := <-done:
			t.Fatalf("the relay exited: %v", err)
		default:
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	})

	t.Run("an idle leader's reads vouch for its lock: its session is sent nothing", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		cfg := e.config(newRecordingSink())
		// A ping every 2 s without the check; a check every 500 ms while
		// the leader stores nothing, so only a read loop stalled for
		// 1.5 s would let a ping through.
		cfg.LeaseInterval = 4 * time.Second
		stop := start(t, cfg)
		defer stop()
		schematest.Eventually(t, 10*time.Second, "the relay leads", func() bool { return e.leaderPID(t, "default") != 0 })
		pid := e.leaderPID(t, "default")
		// Any statement on the session, a ping included, moves its
		// state_change; the first ones (progress load) are over after a
		// few intervals.
		lastStatement := func() time.Time {
			var at time.Time
			if err := e.pool.QueryRow(context.Background(), `SELECT state_change FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&at); err != nil {
				t.Fatal(err)
			}
			return at
		}
		time.Sleep(time.Second)
		before := lastStatement()
		time.Sleep(2500 * time.Millisecond)
		if after := lastStatement(); !after.Equal(before) {
			t.Fatalf("the idle leader's session ran a statement %s after %s: it was pinged", after.Format(time.StampMicro), before.Format(time.StampMicro))
		}
		if e.leaderPID(t, "default") != pid {
			t.Fatal("the stream changed leader")
		}
	})

	t.Run("an idle leader still pings its session now and then, so a connection the network swallows times out", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		cfg := e.config(newRecordingSink()) // a 100 ms lease: a ping at least every second
		stop := start(t, cfg)
		defer stop()
		schematest.Eventually(t, 10*time.Second, "the relay leads", func() bool { return e.leaderPID(t, "default") != 0 })
		pid := e.leaderPID(t, "default")
		var first time.Time
		if err := e.pool.QueryRow(context.Background(), `SELECT state_change FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&first); err != nil {
			t.Fatal(err)
		}
		schematest.Eventually(t, 5*time.Second, "the idle leader's session runs a statement", func() bool {
			var at time.Time
			if err := e.pool.QueryRow(context.Background(), `SELECT state_change FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&at); err != nil {
				t.Fatal(err)
			}
			return at.After(first)
		})
	})

	t.Run("a leader whose session dies while events flow resumes from the stored position without exiting", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		stop := start(t, e.config(sink))
		var ids []int64
		for round := range 5 {
			ids = append(ids, e.append(t, 200)...)
			schematest.Eventually(t, 10*time.Second, "the relay leads", func() bool { return e.leaderPID(t, "default") != 0 })
			e.terminate(t, e.leaderPID(t, "default"))
			t.Logf("round %d: killed the leader's session with %d events in the backlog", round, e.backlog(t))
		}
		schematest.Eventually(t, 30*time.Second, "every event is acknowledged", func() bool { return e.backlog(t) == 0 })
		for _, id := range ids {
			if !sink.has(id) {
				t.Fatalf("event %d was never delivered", id)
			}
		}
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	})
}

// gaugeValue is the value of the named gauge's single series in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single series of %s", name)
	return 0
}

// probingSink is a recordingSink whose Probe fails while it is down.
type probingSink struct{ *recordingSink }

func (s probingSink) Probe(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return errors.New("sink is down")
	}
	return nil
}

func TestRelayProbesTheSink(t *testing.T) {
	t.Parallel()

	t.Run("delivery resumes within about a second of the sink answering, not after the grown backoff", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := probingSink{newRecordingSink()}
		cfg := e.config(sink)
		// The first retry alone would wait 10-20 s.
		cfg.BackoffBase, cfg.BackoffMax = 20*time.Second, 30*time.Second
		sink.setDown(true)
		start(t, cfg)
		ids := e.append(t, 5)
		schematest.Eventually(t, 10*time.Second, "a write fails", func() bool {
			sink.mu.Lock()
			defer sink.mu.Unlock()
			return sink.writes > 0
		})
		time.Sleep(2 * time.Second) // probes fail meanwhile
		sink.setDown(false)
		back := time.Now()
		schematest.Eventually(t, 10*time.Second, "the events are delivered", func() bool { return sink.has(ids[4]) })
		took := time.Since(back)
		t.Logf("delivered %s after the sink answered again", took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Fatalf("delivery resumed %s after the sink answered, want within 2s", took)
		}
	})
}

func TestRelayHealth(t *testing.T) {
	t.Parallel()

	t.Run("a relay that lost its session and cannot reconnect is unhealthy within one lease interval, and healthy once back", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		// The relay's own pool, whose new connections the test can refuse.
		var refuse atomic.Bool
		pc := e.pool.Config()
		pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if refuse.Load() {
				return nil, errors.New("refused by the test")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), pc)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		const lease = 400 * time.Millisecond
		cfg := e.config(newRecordingSink())
		cfg.Pool, cfg.LeaseInterval = pool, lease
		r, err := relay.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
		schematest.Eventually(t, 10*time.Second, "the relay leads", func() bool { return len(r.Leading()) == 1 })
		if err := r.Health(); err != nil {
			t.Fatalf("Health while leading: %v", err)
		}

		refuse.Store(true)
		e.terminate(t, e.leaderPID(t, "default"))
		killed := time.Now()
		schematest.Eventually(t, 10*time.Second, "the relay reports itself unhealthy", func() bool { return r.Health() != nil })
		took := time.Since(killed)
		t.Logf("unhealthy %s after its session was killed (lease interval %s): %v", took.Round(time.Millisecond), lease, r.Health())
		if took > lease+100*time.Millisecond {
			t.Fatalf("healthy for %s after losing its session", took)
		}
		if len(r.Leading()) != 0 {
			t.Fatal("still calls itself leader without a session")
		}

		refuse.Store(false)
		schematest.Eventually(t, 10*time.Second, "the relay is healthy and leads again", func() bool { return r.Health() == nil && len(r.Leading()) == 1 })
	})
}
