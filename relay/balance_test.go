package relay_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
)

// The balancer with relays whose stream sets overlap without one holding
// the other (A and B with s1, s2, s3; C with s1 and s3), as during a
// rolling deploy that adds a destination; and with all relays losing their
// sessions at once (a PostgreSQL failover) and coming back one by one.

const balanceLease = 100 * time.Millisecond

// settleWithin bounds, in lease intervals, how long the relays may take to
// lead every stream they can and spread them; it is generous for a loaded
// machine (the relays usually need a few intervals).
const settleWithin = 100

// balanced is a relay on a gate of its own (see gate), so that a test can
// cut its sessions and let it back independently of the others.
type balanced struct {
	name string
	r    *relay.Relay
	gate *gate
	stop func() error
}

func (e *env) balanced(t *testing.T, name string, streams ...string) *balanced {
	t.Helper()
	g, pool := newGate(t)
	cfg := e.config(newRecordingSink())
	cfg.Pool = pool
	cfg.LeaseInterval = balanceLease
	for _, s := range streams {
		cfg.Streams = append(cfg.Streams, relay.Stream{Name: s, BucketHi: 1023})
	}
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	b := &balanced{name: name, r: r, gate: g}
	stopped := false
	var runErr error
	b.stop = func() error {
		if !stopped {
			stopped = true
			g.open()
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(30 * time.Second):
				runErr = fmt.Errorf("relay %s did not stop within 30s", name)
			}
		}
		return runErr
	}
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Errorf("relay %s: %v", name, err)
		}
	})
	return b
}

// leaders maps each stream to the pid of the session leading it (0: none).
func (e *env) leaders(t *testing.T, streams []string) map[string]int {
	t.Helper()
	ls, err := relay.Leaders(context.Background(), e.pool, e.schema, streams)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, l := range ls {
		out[l.Stream] = l.PID
	}
	return out
}

// spread says which streams lack a leader and what each relay leads.
func (e *env) spread(t *testing.T, streams []string, rs []*balanced) (unled []string, leads map[string][]string) {
	t.Helper()
	for s, pid := range e.leaders(t, streams) {
		if pid == 0 {
			unled = append(unled, s)
		}
	}
	slices.Sort(unled)
	leads = map[string][]string{}
	for _, b := range rs {
		l := b.r.Leading()
		slices.Sort(l)
		leads[b.name] = l
	}
	return unled, leads
}

func describe(unled []string, leads map[string][]string) string {
	var parts []string
	for name, l := range leads {
		parts = append(parts, name+" "+strings.Join(l, ","))
	}
	slices.Sort(parts)
	return fmt.Sprintf("unled [%s]; %s", strings.Join(unled, ","), strings.Join(parts, "; "))
}

// leading says each named relay leads exactly that many streams.
func leading(want map[string]int) func(map[string][]string) bool {
	return func(leads map[string][]string) bool {
		for name, n := range want {
			if len(leads[name]) != n {
				return false
			}
		}
		return true
	}
}

// each says every relay leads lo to hi streams.
func each(lo, hi int) func(map[string][]string) bool {
	return func(leads map[string][]string) bool {
		for _, l := range leads {
			if len(l) < lo || len(l) > hi {
				return false
			}
		}
		return true
	}
}

// settle waits, at most settleWithin lease intervals, until every stream
// has a leader and what the relays lead satisfies want, and returns how
// many lease intervals that took.
func (e *env) settle(t *testing.T, what string, streams []string, rs []*balanced, want func(map[string][]string) bool) float64 {
	t.Helper()
	began := time.Now()
	deadline := began.Add(settleWithin * balanceLease)
	for {
		unled, leads := e.spread(t, streams, rs)
		if len(unled) == 0 && want(leads) {
			took := float64(time.Since(began)) / float64(balanceLease)
			t.Logf("%s: after %.1f lease intervals: %s", what, took, describe(unled, leads))
			return took
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %d lease intervals: %s", what, settleWithin, describe(unled, leads))
		}
		time.Sleep(balanceLease / 4)
	}
}

// steady fails unless for the given number of lease intervals every
// stream keeps its leader and every relay what it leads: nobody fights
// over a stream, nobody hands one back and forth.
func (e *env) steady(t *testing.T, intervals int, streams []string, rs []*balanced) {
	t.Helper()
	first := e.leaders(t, streams)
	_, leads := e.spread(t, streams, rs)
	end := time.Now().Add(time.Duration(intervals) * balanceLease)
	for samples := 0; time.Now().Before(end); samples++ {
		now := e.leaders(t, streams)
		_, l := e.spread(t, streams, rs)
		for _, s := range streams {
			if now[s] == 0 || now[s] != first[s] {
				t.Fatalf("after %d samples stream %s went from leader %d to %d: %s", samples, s, first[s], now[s], describe(nil, l))
			}
		}
		for name := range leads {
			if !slices.Equal(l[name], leads[name]) {
				t.Fatalf("after %d samples relay %s went from %v to %v", samples, name, leads[name], l[name])
			}
		}
		time.Sleep(balanceLease / 4)
	}
}

// abc starts A and B with s1, s2, s3 and then C with s1 and s3, one after
// the other, and waits until every stream is led, one per relay. (With
// shares counted over all relays, A and B were each at a share of one and
// s2 stayed unled.)
func (e *env) abc(t *testing.T) (a, b, c *balanced) {
	t.Helper()
	all := []string{"s1", "s2", "s3"}
	a = e.balanced(t, "A", "s1", "s2", "s3")
	e.settle(t, "A alone leads its three streams", all, []*balanced{a}, leading(map[string]int{"A": 3}))
	b = e.balanced(t, "B", "s1", "s2", "s3")
	e.settle(t, "A and B share the three streams", all, []*balanced{a, b}, leading(map[string]int{"A": 2, "B": 1}))
	c = e.balanced(t, "C", "s1", "s3")
	e.settle(t, "with C every stream is led, one per relay", all, []*balanced{a, b, c}, leading(map[string]int{"A": 1, "B": 1, "C": 1}))
	return a, b, c
}

func TestBalancerLeadsEveryStreamItCan(t *testing.T) {
	t.Parallel()
	all := []string{"s1", "s2", "s3"}

	t.Run("with relays that share only some streams every stream gets a leader and keeps it", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		a, b, c := e.abc(t)
		e.steady(t, 20, all, []*balanced{a, b, c})
	})

	t.Run("relays killed and brought back: every stream is led meanwhile and the spread recovers", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		a, b, c := e.abc(t)
		rs := []*balanced{a, b, c}

		c.gate.cut()
		e.settle(t, "C's sessions gone: A and B lead all three", all, rs, leading(map[string]int{"C": 0}))
		c.gate.open()
		e.settle(t, "C back", all, rs, leading(map[string]int{"A": 1, "B": 1, "C": 1}))
		e.steady(t, 10, all, rs)

		a.gate.cut()
		b.gate.cut()
		// s2 has no live relay that can lead it: only s1 and s3 are led.
		e.settle(t, "A's and B's sessions gone: C leads s1 and s3", []string{"s1", "s3"}, rs, leading(map[string]int{"A": 0, "B": 0, "C": 2}))
		a.gate.open()
		e.settle(t, "A back", all, rs, leading(map[string]int{"B": 0}))
		b.gate.open()
		e.settle(t, "B back", all, rs, leading(map[string]int{"A": 1, "B": 1, "C": 1}))

		// A stopped for good and a new relay with the same streams started.
		if err := a.stop(); err != nil {
			t.Fatal(err)
		}
		a2 := e.balanced(t, "A2", "s1", "s2", "s3")
		rs = []*balanced{a2, b, c}
		e.settle(t, "A replaced", all, rs, leading(map[string]int{"A2": 1, "B": 1, "C": 1}))
		e.steady(t, 20, all, rs)
	})

	t.Run("after every session is lost at once the relays come back one by one and spread again", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		a, b, c := e.abc(t)
		rs := []*balanced{a, b, c}
		for _, r := range rs {
			r.gate.cut()
		}
		e.settle(t, "every session gone", []string{}, rs, leading(map[string]int{"A": 0, "B": 0, "C": 0}))
		a.gate.open()
		e.settle(t, "A back first leads everything", all, rs, leading(map[string]int{"A": 3}))
		b.gate.open()
		e.settle(t, "B back", all, rs, leading(map[string]int{"A": 2, "B": 1}))
		c.gate.open()
		e.settle(t, "C back", all, rs, leading(map[string]int{"A": 1, "B": 1, "C": 1}))
		e.steady(t, 20, all, rs)
	})
}

// TestClusterPostgresFailover in process: relays with the same streams
// (partitions and one stream every relay has, like webhook-unrouted) lose
// every session at once and come back at different times. The first one
// back leads everything while it is alone and hands streams over as the
// others return, down to its share.
func TestBalancerAfterFailoverSpreadsTheStreamsAgain(t *testing.T) {
	t.Parallel()

	run := func(t *testing.T, relays, partitions int, want []func(map[string][]string) bool) {
		e := setup(t)
		ps, err := relay.Partitions("p", partitions)
		if err != nil {
			t.Fatal(err)
		}
		var streams []string
		for _, p := range ps {
			streams = append(streams, p.Name)
		}
		streams = append(streams, "webhook-unrouted")
		var rs []*balanced
		for i := range relays {
			rs = append(rs, e.balanced(t, fmt.Sprintf("R%d", i+1), streams...))
		}
		e.settle(t, "all relays", streams, rs, each(1, (partitions+1+relays-1)/relays))
		for _, r := range rs {
			r.gate.cut()
		}
		e.settle(t, "every session gone", nil, rs, each(0, 0))
		for i, r := range rs {
			r.gate.open()
			e.settle(t, r.name+" back", streams, rs, want[i])
		}
		e.steady(t, 20, streams, rs)
	}

	t.Run("two relays with two partitions lead them and the shared stream again", func(t *testing.T) {
		t.Parallel()
		run(t, 2, 2, []func(map[string][]string) bool{leading(map[string]int{"R1": 3}), leading(map[string]int{"R1": 2, "R2": 1})})
	})

	t.Run("three relays with six partitions end at one to three streams each", func(t *testing.T) {
		t.Parallel()
		run(t, 3, 6, []func(map[string][]string) bool{leading(map[string]int{"R1": 7}), leading(map[string]int{"R1": 4, "R2": 3}), each(1, 3)})
	})
}
