package relay

import (
	"testing"
	"time"
)

func TestNextWait(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		prev    time.Duration
		quieted bool
		want    time.Duration
	}{
		{0, false, 2 * ms},
		{2 * ms, false, 4 * ms},
		{64 * ms, false, 100 * ms},
		{100 * ms, false, 100 * ms},
		{100 * ms, true, 200 * ms},
		{200 * ms, true, 250 * ms},
		{250 * ms, false, 100 * ms}, // an event ends the quiet: back to idle's limit
	} {
		if got := nextWait(c.prev, 2*ms, 100*ms, 250*ms, c.quieted); got != c.want {
			t.Errorf("nextWait(%s, quieted %v) = %s, want %s", c.prev, c.quieted, got, c.want)
		}
	}
}

func TestLockCheckSeen(t *testing.T) {
	now := time.Now()
	c := &lockCheck{every: 500 * time.Millisecond}
	if held, lost := c.seen(now, time.Second); held || lost {
		t.Fatal("no check yet must vouch for nothing")
	}
	if !c.due(now) {
		t.Fatal("a first check is due")
	}
	c.at, c.held = now.Add(-100*time.Millisecond), true
	if c.due(now) {
		t.Fatal("a check 100ms old is not due again at every/4 = 125ms")
	}
	c.noteStore(now.Add(-200 * time.Millisecond))
	if c.due(now) {
		t.Fatal("a check is not due within half an interval of a store")
	}
	c.noteStore(time.Time{})
	if held, lost := c.seen(now, 500*time.Millisecond); !held || lost {
		t.Fatal("a fresh check that found the lock held vouches for it")
	}
	if held, lost := c.seen(now.Add(time.Second), 500*time.Millisecond); held || lost {
		t.Fatal("an old check vouches for nothing: the leader pings")
	}
	c.held = false
	if _, lost := c.seen(now.Add(time.Hour), 500*time.Millisecond); !lost {
		t.Fatal("a check that found the lock not held means the lock is lost, however old")
	}
}
