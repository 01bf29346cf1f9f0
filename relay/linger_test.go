package relay_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// timingSink notes the size of every write and when each event arrived.
type timingSink struct {
	mu     sync.Mutex
	writes []int
	at     map[int64]time.Time
}

func newTimingSink() *timingSink { return &timingSink{at: map[int64]time.Time{}} }

func (s *timingSink) Write(_ context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, len(events))
	outs := make([]outbox.Outcome, len(events))
	for i, e := range events {
		outs[i] = outbox.Outcome{Status: outbox.Applied}
		if _, ok := s.at[e.ID]; !ok {
			s.at[e.ID] = now
		}
	}
	return outs, nil
}

func (s *timingSink) arrived(id int64) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.at[id]
	return t, ok
}

func (s *timingSink) count() (writes, events int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.writes), len(s.at)
}

// trickle commits n events one per transaction, one every 20ms, and
// returns when each committed.
func (e *env) trickle(t *testing.T, n int) map[int64]time.Time {
	t.Helper()
	committed := make(map[int64]time.Time, n)
	for range n {
		ids := e.append(t, 1)
		committed[ids[0]] = time.Now()
		time.Sleep(20 * time.Millisecond)
	}
	return committed
}

// waitEvents waits until the sink has n distinct events.
func (s *timingSink) waitEvents(t *testing.T, n int) {
	t.Helper()
	schematest.Eventually(t, 20*time.Second, "every event delivered", func() bool {
		_, got := s.count()
		return got == n
	})
}

// appendMany commits n events in one transaction, so that the relay finds
// them all in one snapshot.
func (e *env) appendMany(t *testing.T, n int) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), `SELECT "`+e.schema+`".append('items', 'm' || i, 1, 'upsert', jsonb_build_object('n', i))
		FROM generate_series(1, $1) i`, n)
	if err != nil {
		t.Fatal(err)
	}
}

func TestRelayLinger(t *testing.T) {
	t.Parallel()

	t.Run("at a low rate the sink gets fewer, larger writes, each event within the linger", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newTimingSink()
		cfg := e.config(sink)
		cfg.Linger = 300 * time.Millisecond
		cfg.LingerDocs = 1000
		start(t, cfg)
		// One event every 20ms for 1.5s: without the linger, about one
		// write per event.
		committed := e.trickle(t, 75)
		sink.waitEvents(t, len(committed))
		writes, _ := sink.count()
		if writes > 15 {
			t.Errorf("75 events at 50/s took %d writes; with a 300ms linger want at most 15", writes)
		}
		var worst time.Duration
		for id, c := range committed {
			a, _ := sink.arrived(id)
			worst = max(worst, a.Sub(c))
		}
		// The linger ends on its timer, not at LingerDocs (1000, never
		// reached here). The bound leaves room for a machine with ten
		// test suites per core (1.3 s was seen); the latency itself is
		// measured by scripts/bench's lowrate scenario, not here.
		if worst > cfg.Linger+2500*time.Millisecond {
			t.Errorf("an event took %v from commit to the sink; want the 300ms linger to end on its timer", worst)
		}
		t.Logf("%d writes; slowest event %v", writes, worst.Round(time.Millisecond))
	})

	t.Run("a trickle is read about once per write, not polled", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newTimingSink()
		cfg := e.config(sink)
		cfg.Linger = 300 * time.Millisecond
		cfg.LingerDocs = 10
		var reads atomic.Int64
		relay.CountReads(&cfg, &reads)
		start(t, cfg)
		// One event every 20ms for 2s: LingerDocs are there every 200ms.
		// Reading again right after each write found an event or two,
		// polled from MinPollInterval up and read once more for the rest:
		// 29 reads for 10 writes.
		e.append(t, 1)
		schematest.Eventually(t, 10*time.Second, "the first event delivered", func() bool {
			_, n := sink.count()
			return n == 1
		})
		reads.Store(0)
		w0, _ := sink.count()
		e.trickle(t, 100)
		sink.waitEvents(t, 101)
		writes, _ := sink.count()
		writes -= w0
		// Reads that found nothing (a stalled writer) are not counted.
		if r := reads.Load(); r > int64(writes*8/5)+3 {
			t.Errorf("100 events at 50/s: %d reads for %d writes; want about one read per write", r, writes)
		} else {
			t.Logf("%d reads for %d writes", r, writes)
		}
	})

	t.Run("a stream with NoLinger does not wait", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newTimingSink()
		cfg := e.config(sink)
		cfg.Linger = time.Minute
		cfg.LingerDocs = 1000
		cfg.Streams = []relay.Stream{{Name: "no-linger", BucketHi: 1023, NoLinger: true}}
		start(t, cfg)
		e.append(t, 1)
		sink.waitEvents(t, 1) // well before the minute's linger
	})

	t.Run("a page that reaches LingerDocs goes at once", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newTimingSink()
		cfg := e.config(sink)
		cfg.Linger = time.Minute
		cfg.LingerDocs = 50
		start(t, cfg)
		e.appendMany(t, 60)
		sink.waitEvents(t, 60) // well before the minute's linger
	})

	t.Run("a backlog is not held back", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.appendMany(t, 2500)
		sink := newTimingSink()
		cfg := e.config(sink)
		cfg.MaxBatchDocs = 1000
		cfg.Linger = time.Minute
		cfg.LingerDocs = 1000
		start(t, cfg)
		// Two full pages, then the batch's last 500: read right after a
		// full page, they are the end of a backlog, not a trickle.
		sink.waitEvents(t, 2500) // well before the minute's linger
	})

	t.Run("shutdown during a linger is prompt and loses nothing", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newTimingSink()
		cfg := e.config(sink)
		cfg.Linger = time.Minute
		cfg.LingerDocs = 1000
		stop := start(t, cfg)
		ids := e.append(t, 5)
		time.Sleep(500 * time.Millisecond) // read, and lingering
		if _, n := sink.count(); n != 0 {
			t.Fatalf("%d events delivered during a minute's linger", n)
		}
		began := time.Now()
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if took := time.Since(began); took > 2*time.Second {
			t.Errorf("shutdown during a linger took %v", took)
		}
		// The lingering page may still reach the sink in the shutdown's
		// drain (the read loop and the writer each pick a ready channel
		// at random); what must not happen is an event acknowledged that
		// the sink never got.
		b := e.backlog(t)
		got := 0
		for _, id := range ids {
			if _, ok := sink.arrived(id); ok {
				got++
			}
		}
		if int64(len(ids))-b > int64(got) {
			t.Fatalf("after shutdown: %d of the %d lingering events acknowledged, but the sink got only %d", int64(len(ids))-b, len(ids), got)
		}
		cfg.Linger = -1
		cfg.Registerer = nil
		start(t, cfg)
		schematest.Eventually(t, 10*time.Second, "the lingering events delivered by the next relay", func() bool {
			for _, id := range ids {
				if _, ok := sink.arrived(id); !ok {
					return false
				}
			}
			return true
		})
		schematest.Eventually(t, 10*time.Second, "and acknowledged", func() bool { return e.backlog(t) == 0 })
	})
}

var _ relay.Sink = (*timingSink)(nil)
