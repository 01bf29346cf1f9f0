package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
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

		schematest.Eventually(t, 10*time.Second, "one leader", func() bool { return len(ra.Leading())+len(rb.Leading()) == 1 })
		schematest.Eventually(t, 10*time.Second, "stats name the leader's session", func() bool {
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
		schematest.Eventually(t, 10*time.Second, "leader delivers", func() bool { return leaderSink.has(ids[9]) })
		if standbySink.delivered() != 0 {
			t.Fatal("the standby delivered events while the leader was alive")
		}
		stopLeader()
		schematest.Eventually(t, 10*time.Second, "standby takes over", func() bool { return len(standby.Leading()) == 1 })
		more := e.append(t, 10)
		schematest.Eventually(t, 10*time.Second, "new leader delivers", func() bool { return standbySink.has(more[9]) })
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
		schematest.Eventually(t, 15*time.Second, "A alone takes both partitions first", func() bool { return len(ra.Leading()) == 2 })
		go func() { _ = rb.Run(ctx) }()
		schematest.Eventually(t, 15*time.Second, "one partition each", func() bool { return len(ra.Leading()) == 1 && len(rb.Leading()) == 1 })

		ids := e.append(t, 400)
		schematest.Eventually(t, 15*time.Second, "all delivered", func() bool { return sinkA.delivered()+sinkB.delivered() == len(ids) })
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

	t.Run("with two partitions, the survivor leads both when the other relay dies", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		streams, err := relay.Partitions("p", 2)
		if err != nil {
			t.Fatal(err)
		}
		sinkA, sinkB := newRecordingSink(), newRecordingSink()
		cfgA, cfgB := e.config(sinkA), e.config(sinkB)
		cfgA.Streams, cfgB.Streams = streams, streams
		ra, err := relay.New(cfgA)
		if err != nil {
			t.Fatal(err)
		}
		rb, err := relay.New(cfgB)
		if err != nil {
			t.Fatal(err)
		}
		ctxA, cancelA := context.WithCancel(context.Background())
		ctxB, cancelB := context.WithCancel(context.Background())
		doneA, doneB := make(chan error, 1), make(chan error, 1)
		go func() { doneA <- ra.Run(ctxA) }()
		go func() { doneB <- rb.Run(ctxB) }()
		t.Cleanup(func() {
			cancelA()
			cancelB()
			<-doneB
		})

		schematest.Eventually(t, 15*time.Second, "one partition each", func() bool { return len(ra.Leading()) == 1 && len(rb.Leading()) == 1 })
		first := e.append(t, 200)
		schematest.Eventually(t, 15*time.Second, "both relays deliver", func() bool { return sinkA.delivered()+sinkB.delivered() == len(first) })
		if sinkA.delivered() == 0 || sinkB.delivered() == 0 {
			t.Fatalf("one relay did all the work: %d and %d", sinkA.delivered(), sinkB.delivered())
		}

		// Relay A dies: its sessions, and with them its stream locks, go away.
		cancelA()
		select {
		case err := <-doneA:
			if err != nil {
				t.Fatalf("relay A: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("relay A did not stop")
		}
		schematest.Eventually(t, 20*time.Second, "the survivor leads both partitions", func() bool { return len(rb.Leading()) == 2 })

		aBefore := sinkA.delivered()
		more := e.append(t, 200)
		schematest.Eventually(t, 15*time.Second, "the survivor delivers every new event", func() bool {
			for _, id := range more {
				if !sinkB.has(id) {
					return false
				}
			}
			return true
		})
		if sinkA.delivered() != aBefore {
			t.Fatal("the stopped relay delivered events")
		}
		// The new events must span both partitions, or the survivor could have
		// delivered them while leading only its own.
		var inFirst, inSecond int
		err = e.pool.QueryRow(context.Background(),
			`SELECT count(*) FILTER (WHERE bucket BETWEEN $2 AND $3), count(*) FILTER (WHERE bucket BETWEEN $4 AND $5) FROM "`+e.schema+`".events WHERE id = ANY($1)`,
			more, streams[0].BucketLo, streams[0].BucketHi, streams[1].BucketLo, streams[1].BucketHi).Scan(&inFirst, &inSecond)
		if err != nil {
			t.Fatal(err)
		}
		if inFirst == 0 || inSecond == 0 || inFirst+inSecond != len(more) {
			t.Fatalf("the new events fall %d/%d into the partitions; the test proves nothing", inFirst, inSecond)
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
