package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// A and B serve s1 s2 s3, C serves s1 s3 only. The shares count C, so
// once A hands s2 back for balance, A and B are both at their share while
// s2 has no leader: one of them must take it beyond its share.
func TestBalancerLeadsAStreamNobodyLeads(t *testing.T) {
	e := setup(t)
	run := func(names ...string) *relay.Relay {
		cfg := e.config(newRecordingSink())
		for _, n := range names {
			cfg.Streams = append(cfg.Streams, relay.Stream{Name: n, BucketHi: 1023})
		}
		r, err := relay.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return r
	}
	ra := run("s1", "s2", "s3")
	schematest.Eventually(t, 15*time.Second, "A leads 3", func() bool { return len(ra.Leading()) == 3 })
	rb := run("s1", "s2", "s3")
	schematest.Eventually(t, 15*time.Second, "A 2, B 1", func() bool { return len(ra.Leading()) == 2 && len(rb.Leading()) == 1 })
	rc := run("s1", "s3")
	schematest.Eventually(t, 30*time.Second, "every stream led", func() bool {
		ls, _ := relay.Leaders(context.Background(), e.pool, e.schema, []string{"s1", "s2", "s3"})
		n := 0
		for _, l := range ls {
			if l.PID != 0 {
				n++
			}
		}
		t.Logf("A %v B %v C %v led %d", ra.Leading(), rb.Leading(), rc.Leading(), n)
		return n == 3
	})
}
