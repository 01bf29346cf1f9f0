package relaytest

import (
	"context"
	"sync"
	"testing"

	"github.com/outboxd/outboxd/relay"
)

// Start builds a relay from cfg and runs it in this process until the
// returned stop is called or the test ends; stop waits for Run to return
// and reports its error. The cleanup is registered before the caller's
// later ones, so it runs before a schema set up earlier is dropped.
func Start(t testing.TB, cfg relay.Config) (stop func()) {
	t.Helper()
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return Run(t, r)
}

// Run runs r (for a caller that keeps it, to watch Leading and the like)
// as Start does.
func Run(t testing.TB, r *relay.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
