package admin

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
)

// The backlog count scans every event behind each stream: a slow one is
// not repeated sooner than 50 times its duration, whoever asks.
func TestStatsCache(t *testing.T) {
	t.Parallel()
	fetches := 0
	c := &statsCache{ttl: time.Second, fetch: func(context.Context) (*relay.Stats, error) {
		fetches++
		return &relay.Stats{}, nil
	}}
	ask := func() {
		t.Helper()
		if _, err := c.get(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("a fast fetch is served for the TTL", func(t *testing.T) {
		ask()
		ask()
		if fetches != 1 {
			t.Fatalf("%d fetches, want 1", fetches)
		}
		if got := c.maxAge(); got != time.Second {
			t.Fatalf("served for %s, want the TTL (1s)", got)
		}
	})

	t.Run("a slow fetch is served for 50 times its duration", func(t *testing.T) {
		c.took = 100 * time.Millisecond
		if got := c.maxAge(); got != 5*time.Second {
			t.Fatalf("served for %s, want 5s", got)
		}
		c.at = time.Now().Add(-2 * time.Second) // past the TTL, within 5s
		ask()
		if fetches != 1 {
			t.Fatalf("%d fetches, want still 1", fetches)
		}
	})

	t.Run("however slow, a fetch is repeated within a minute", func(t *testing.T) {
		c.took = 10 * time.Second
		if got := c.maxAge(); got != time.Minute {
			t.Fatalf("served for %s, want 1m", got)
		}
	})
}
