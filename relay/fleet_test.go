package relay_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// A rolling deploy that adds a stream: relay B has streams s1, s2, s3 and
// starts first, then relay A with s1 and s2 joins. B must not hand s3 over
// to balance the fleet (A cannot lead it); it hands over one of the
// streams both have instead, and every stream keeps a leader.
func TestBalancerHandsAStreamOnlyToARelayThatCanLeadIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	streams := func(names ...string) []relay.Stream {
		var out []relay.Stream
		for _, n := range names {
			out = append(out, relay.Stream{Name: n, BucketHi: 1023})
		}
		return out
	}
	run := func(names ...string) *relay.Relay {
		cfg := e.config(newRecordingSink())
		cfg.Streams = streams(names...)
		r, err := relay.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		})
		return r
	}
	rb := run("s1", "s2", "s3")
	schematest.Eventually(t, 15*time.Second, "B alone leads its three streams", func() bool { return len(rb.Leading()) == 3 })
	ra := run("s1", "s2")
	led := func() int {
		ls, err := relay.Leaders(context.Background(), e.pool, e.schema, []string{"s1", "s2", "s3"})
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
	schematest.Eventually(t, 15*time.Second, "A takes one shared stream, B keeps s3, all three are led", func() bool {
		return len(ra.Leading()) == 1 && slices.Contains(rb.Leading(), "s3") && led() == 3
	})
	// Several balance rounds later the split holds.
	time.Sleep(500 * time.Millisecond)
	if len(ra.Leading()) != 1 || len(rb.Leading()) != 2 || !slices.Contains(rb.Leading(), "s3") || led() != 3 {
		t.Fatalf("A leads %v, B leads %v, %d of 3 streams led", ra.Leading(), rb.Leading(), led())
	}
}
