package main

import (
	"context"
	"sync"
	"sync/atomic"
)

// inChunks calls fill for ids 1..n in ranges of 10,000 (lo..hi, both
// included), workers ranges at a time, and returns the first error; the
// other workers stop at their next range once ctx is done.
func inChunks(ctx context.Context, n, workers int, fill func(lo, hi int64) error) error {
	const chunk = 10_000
	var next atomic.Int64
	next.Store(1)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := next.Add(chunk) - chunk
				if lo > int64(n) || ctx.Err() != nil {
					return
				}
				if err := fill(lo, min(lo+chunk-1, int64(n))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
