package relay_test

import (
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
)

func TestRelayQuietPolls(t *testing.T) {
	t.Parallel()

	t.Run("a stream without events for QuietAfter polls every QuietPollInterval, and at MaxPollInterval again after an event", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newTimingSink()
		cfg := e.config(sink)
		cfg.MaxPollInterval = 10 * time.Millisecond
		cfg.QuietAfter = 600 * time.Millisecond
		cfg.QuietPollInterval = 400 * time.Millisecond
		cfg.Linger = -1
		type read struct {
			at     time.Time
			events int
		}
		var mu sync.Mutex
		var reads []read
		relay.ObservePolls(&cfg, func(n int) {
			mu.Lock()
			reads = append(reads, read{time.Now(), n})
			mu.Unlock()
		})
		stop := start(t, cfg)
		defer stop()
		time.Sleep(4500 * time.Millisecond)
		e.append(t, 1)
		sink.waitEvents(t, 1)
		time.Sleep(cfg.QuietAfter + 100*time.Millisecond)
		if err := stop(); err != nil {
			t.Fatal(err)
		}

		mu.Lock()
		defer mu.Unlock()
		first, event := reads[0].at, -1
		for i, r := range reads {
			if r.events > 0 {
				event = i
				break
			}
		}
		if event < 0 || event+1 >= len(reads) {
			t.Fatalf("no read found the event, or none followed it (%d reads)", len(reads))
		}
		// Quiet from QuietAfter on; the wait has grown to its limit two
		// doublings later.
		settled := first.Add(cfg.QuietAfter + 2*cfg.QuietPollInterval)
		quiet := 0
		for i := 1; i < event; i++ {
			if reads[i-1].at.Before(settled) {
				continue
			}
			quiet++
			if gap := reads[i].at.Sub(reads[i-1].at); gap < cfg.QuietPollInterval*9/10 {
				t.Fatalf("a quiet stream polled %s after its previous poll (QuietPollInterval %s)", gap, cfg.QuietPollInterval)
			}
		}
		if quiet < 3 {
			t.Fatalf("only %d polls of the quiet stream to check", quiet)
		}
		// Until QuietAfter has passed again, the waits are MaxPollInterval's.
		busy := 0
		for i := event + 1; i < len(reads) && reads[i].at.Before(reads[event].at.Add(cfg.QuietAfter-50*time.Millisecond)); i++ {
			busy++
			if gap := reads[i].at.Sub(reads[i-1].at); gap >= cfg.QuietPollInterval/2 {
				t.Fatalf("%s after an event the stream waited %s to poll again, not MaxPollInterval's at most", reads[i].at.Sub(reads[event].at), gap)
			}
		}
		if busy < 5 {
			t.Fatalf("only %d polls after the event to check", busy)
		}
		t.Logf("%d reads; %d quiet gaps of at least %s; %d polls after the event", len(reads), quiet, cfg.QuietPollInterval*9/10, busy)
	})
}
