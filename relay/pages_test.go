package relay_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// sizeSink notes the bytes of every write and how often each event came.
type sizeSink struct {
	mu     sync.Mutex
	writes []int
	count  map[int64]int
}

func (s *sizeSink) Write(_ context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	outs := make([]outbox.Outcome, len(events))
	for i := range events {
		n += events[i].Size()
		s.count[events[i].ID]++
		outs[i] = outbox.Outcome{Status: outbox.Applied}
	}
	s.writes = append(s.writes, n)
	return outs, nil
}

func TestRelayPagesByBytes(t *testing.T) {
	t.Parallel()
	t.Run("MaxBatchBytes bounds every page", func(t *testing.T) {
		t.Parallel()
		pagesWithin(t, 256<<10, func(cfg *relay.Config) { cfg.MaxBatchBytes = 256 << 10 })
	})
	t.Run("a stream's own MaxBatchBytes bounds its pages", func(t *testing.T) {
		t.Parallel()
		pagesWithin(t, 128<<10, func(cfg *relay.Config) {
			cfg.MaxBatchBytes = 4 << 20
			cfg.Streams = []relay.Stream{{Name: "small-pages", BucketHi: 1023, MaxBatchBytes: 128 << 10}}
		})
	})
	t.Run("a negative MaxBatchBytes of a stream is refused", func(t *testing.T) {
		t.Parallel()
		_, err := relay.New(relay.Config{Pool: setup(t).pool, Sink: &sizeSink{}, Streams: []relay.Stream{{Name: "s", BucketHi: 1023, MaxBatchBytes: -1}}})
		if err == nil || !strings.Contains(err.Error(), "MaxBatchBytes") {
			t.Fatalf("relay.New: %v, want an error naming MaxBatchBytes", err)
		}
	})
}

// pagesWithin delivers 1,600 events of mixed sizes with the relay
// configured by set and checks that each arrived once and that no write
// carried more than bound bytes plus one event.
func pagesWithin(t *testing.T, bound int, set func(*relay.Config)) {
	e := setup(t)
	// Large documents, then small ones, then large again, in one snapshot:
	// the page size the reader learns from one part is wrong for the next.
	_, err := e.pool.Exec(context.Background(), `SELECT "`+e.schema+`".append('items', 'p' || i, 1, 'upsert',
			jsonb_build_object('pad', repeat('x', CASE WHEN i <= 300 OR i > 1300 THEN 10000 ELSE 10 END)))
		FROM generate_series(1, 1600) i`)
	if err != nil {
		t.Fatal(err)
	}
	sink := &sizeSink{count: map[int64]int{}}
	cfg := e.config(sink)
	cfg.MaxBatchDocs = 1000
	cfg.InFlight = 1 // one page per write
	cfg.Linger = -1
	set(&cfg)
	start(t, cfg)
	schematest.Eventually(t, 30*time.Second, "every event delivered and acknowledged", func() bool {
		sink.mu.Lock()
		n := len(sink.count)
		sink.mu.Unlock()
		return n == 1600 && e.backlog(t) == 0
	})
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for id, c := range sink.count {
		if c != 1 {
			t.Errorf("event %d delivered %d times", id, c)
		}
	}
	largest := 10000 + 200
	for i, b := range sink.writes {
		if b > bound+largest {
			t.Errorf("write %d carried %d bytes; pages are bounded by %d and one event", i, b, bound)
		}
	}
	t.Logf("%d writes", len(sink.writes))
}
