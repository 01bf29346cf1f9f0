package webhook

import (
	"context"
	"sync"
	"time"
)

// breaker pauses a destination whose receiver keeps failing: after
// threshold consecutive failed attempts (not sent, 408, 429, 5xx, no
// answer) no request goes out for cooldown; then one message's attempt is
// the probe, and its success resumes the destination. Messages wait while
// it is open: the pause charges none of their attempts, and fails none.
type breaker struct {
	threshold int // 0: never open
	cooldown  time.Duration
	changed   func(open bool)

	mu        sync.Mutex
	failures  int
	openUntil time.Time // zero: closed
	probing   bool
	wake      chan struct{} // closed when the state changes
}

func newBreaker(threshold int, cooldown time.Duration, changed func(open bool)) *breaker {
	return &breaker{threshold: threshold, cooldown: cooldown, changed: changed, wake: make(chan struct{})}
}

// admit waits until a request may go; probe says it is the one that
// decides whether the destination resumes.
func (b *breaker) admit(ctx context.Context) (probe bool, err error) {
	if b.threshold <= 0 {
		return false, nil
	}
	for {
		b.mu.Lock()
		now := time.Now()
		switch {
		case b.openUntil.IsZero():
			b.mu.Unlock()
			return false, nil
		case !b.probing && !now.Before(b.openUntil):
			b.probing = true
			b.mu.Unlock()
			return true, nil
		}
		wait, wake := b.openUntil.Sub(now), b.wake
		if b.probing {
			wait = b.cooldown
		}
		b.mu.Unlock()
		select {
		case <-time.After(wait):
		case <-wake:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// result records how an admitted attempt went.
func (b *breaker) result(probe, ok bool) {
	if b.threshold <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	wasOpen := !b.openUntil.IsZero()
	if probe {
		b.probing = false
	}
	switch {
	case ok:
		b.failures = 0
		b.openUntil = time.Time{}
	case probe || wasOpen:
		b.openUntil = time.Now().Add(b.cooldown)
	default:
		b.failures++
		if b.failures >= b.threshold {
			b.openUntil = time.Now().Add(b.cooldown)
		}
	}
	if isOpen := !b.openUntil.IsZero(); isOpen != wasOpen {
		close(b.wake)
		b.wake = make(chan struct{})
		b.changed(isOpen)
	} else if probe {
		close(b.wake)
		b.wake = make(chan struct{})
	}
}
