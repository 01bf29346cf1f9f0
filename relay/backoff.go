package relay

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff is exponential with "equal jitter": half fixed, half random, so
// retries spread out without collapsing to near zero.
func backoff(base, limit time.Duration, n int) time.Duration {
	d := base << min(n, 30)
	if d <= 0 || d > limit {
		d = limit
	}
	return d/2 + rand.N(d/2+1)
}

func jitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
