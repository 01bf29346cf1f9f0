package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
)

func TestRelayHighAvailability(t *testing.T) {
	t.Parallel()

	t.Run("two relays never lead one stream at once and the standby takes over", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sinkA, sinkB := newRecordingSink(), newRecordingSink()
		ra, err := relay.New(e.config(sinkA))
		if err != nil {
			t.Fatal(err)
		}
		rb, err := relay.New(e.config(sinkB))
		if err != nil {
			t.Fatal(err)
		}
		ctxA, stopA := context.WithCancel(context.Background())
		ctxB, stopB := context.WithCancel(context.Background())
		defer stopB()
		doneA := make(chan error, 1)
		go func() { doneA <- ra.Run(ctxA) }()
		go func() { _ = rb.Run(ctxB) }()

		eventually(t, 10*time.Second, "one leader", func() bool { return len(ra.Leading())+len(rb.Leading()) == 1 })
		eventually(t, 10*time.Second, "stats name the leader's session", func() bool {
			st, err := relay.CollectStats(context.Background(), e.pool, e.schema)
			return err == nil && len(st.Streams) == 1 && st.Streams[0].LeaderPID != 0
		})
		for range 50 {
			if n := len(ra.Leading()) + len(rb.Leading()); n > 1 {
				t.Fatalf("%d relays lead the stream at once", n)
			}
			time.Sleep(10 * time.Millisecond)
		}
		leader, standby, stopLeader, leaderSink, standbySink := ra, rb, stopA, sinkA, sinkB
		if len(rb.Leading()) == 1 {
			leader, standby, stopLeader, leaderSink, standbySink = rb, ra, stopB, sinkB, sinkA
		}
		_ = leader
		ids := e.append(t, 10)
		eventually(t, 10*time.Second, "leader delivers", func() bool { return leaderSink.has(ids[9]) })
		if standbySink.delivered() != 0 {
			t.Fatal("the standby delivered events while the leader was alive")
		}
		stopLeader()
		eventually(t, 10*time.Second, "standby takes over", func() bool { return len(standby.Leading()) == 1 })
		more := e.append(t, 10)
		eventually(t, 10*time.Second, "new leader delivers", func() bool { return standbySink.has(more[9]) })
	})

	t.Run("with two partitions two relays work at once and each sees only its share", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		streams, err := relay.Partitions("p", 2)
		if err != nil {
			t.Fatal(err)
		}
		sinkA, sinkB := newRecordingSink(), newRecordingSink()
		cfgA, cfgB := e.config(sinkA), e.config(sinkB)
		cfgA.Streams, cfgB.Streams = streams, streams
		ra, _ := relay.New(cfgA)
		rb, _ := relay.New(cfgB)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = ra.Run(ctx) }()
		time.Sleep(300 * time.Millisecond) // A alone takes both partitions first
		go func() { _ = rb.Run(ctx) }()
		eventually(t, 15*time.Second, "one partition each", func() bool { return len(ra.Leading()) == 1 && len(rb.Leading()) == 1 })

		ids := e.append(t, 400)
		eventually(t, 15*time.Second, "all delivered", func() bool { return sinkA.delivered()+sinkB.delivered() == len(ids) })
		if sinkA.delivered() == 0 || sinkB.delivered() == 0 {
			t.Fatalf("one relay did all the work: %d and %d", sinkA.delivered(), sinkB.delivered())
		}
		for _, id := range ids {
			if sinkA.has(id) && sinkB.has(id) {
				t.Fatalf("event %d delivered by both relays", id)
			}
		}
		var bad int
		err = e.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM "%s".events e JOIN "%s".progress p ON e.bucket NOT BETWEEN p.bucket_lo AND p.bucket_hi WHERE p.stream = $1 AND e.id = ANY($2)`, e.schema, e.schema),
			ra.Leading()[0], idsOf(sinkA)).Scan(&bad)
		if err != nil {
			t.Fatal(err)
		}
		if bad != 0 {
			t.Fatalf("relay A delivered %d events outside its partition", bad)
		}
	})
}

func idsOf(s *recordingSink) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int64, 0, len(s.count))
	for id := range s.count {
		out = append(out, id)
	}
	return out
}
