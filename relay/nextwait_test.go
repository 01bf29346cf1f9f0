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

func TestQuietWait(t *testing.T) {
	c := &Config{MaxPollInterval: 100 * time.Millisecond, QuietPollInterval: 250 * time.Millisecond}
	if got := c.quietWait(Stream{}); got != 250*time.Millisecond {
		t.Errorf("quietWait = %s, want QuietPollInterval", got)
	}
	if got := c.quietWait(Stream{MaxPollInterval: time.Second}); got != time.Second {
		t.Errorf("quietWait of a stream polling once a second = %s, want its own interval", got)
	}
	c.QuietPollInterval = 50 * time.Millisecond
	if got := c.quietWait(Stream{}); got != 100*time.Millisecond {
		t.Errorf("quietWait with QuietPollInterval under MaxPollInterval = %s, want MaxPollInterval", got)
	}
}

func TestLockCheckVouches(t *testing.T) {
	now := time.Now()
	c := &lockCheck{every: 500 * time.Millisecond}
	if c.vouches(now, time.Second) {
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
	if !c.vouches(now, 500*time.Millisecond) {
		t.Fatal("a fresh check that found the lock held vouches for it")
	}
	if c.vouches(now.Add(time.Second), 500*time.Millisecond) {
		t.Fatal("an old check vouches for nothing: the leader pings")
	}
	c.held = false
	if c.vouches(now, 500*time.Millisecond) {
		t.Fatal("a fresh check that found the lock not held vouches for nothing")
	}
}
