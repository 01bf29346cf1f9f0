package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"
)

// rssScenario drains backlogs of growing size in a relay child process and
// reports its peak resident set (VmHWM) and rate: memory must not grow with
// the backlog, and neither may the time per event.
func (b *bench) rssScenario(ctx context.Context) error {
	cfg := b.cfg
	sizes, _ := cfg.rss()
	var rates []float64
	var peak int64
	for _, n := range sizes {
		s, err := b.newSchema(ctx)
		if err != nil {
			return err
		}
		took, err := loadBacklog(ctx, b.pool, s, "bench", 1, int64(n), cfg.loadTx, cfg.loadWorkers)
		if err != nil {
			return err
		}
		b.rep.line("backlog of %d loaded in %s (%s)", n, took.Round(time.Millisecond), rate(float64(n)/took.Seconds()))
		profile := ""
		if cfg.profileDir != "" {
			profile = filepath.Join(cfg.profileDir, fmt.Sprintf("rss-%d.pprof", n))
		}
		res, err := b.runChild(ctx, s, n, cfg.pageDocs, profile)
		if err != nil {
			return err
		}
		b.rep.key("rss: drain of %d: peak RSS (VmHWM) %s, Go heap peak %.1f MB, %s (%.2fs, child CPU %.1f µs/event, load avg %s)",
			n, mb(res.VmHWMKB), float64(res.HeapPeak)/(1<<20), rate(res.Rate), res.Seconds, res.CPU*1e6/float64(n), loadAvg())
		rates = append(rates, res.Rate)
		peak = max(peak, res.VmHWMKB)
		// The next backlog gets the disk and the cache to itself.
		b.dropSchema(ctx, s)
	}
	b.rep.goal(peak <= 100*1024, "peak RSS <= 100 MB at every backlog size: %s", mb(peak))
	if len(rates) > 1 {
		r := rates[len(rates)-1] / rates[0]
		b.rep.key("rss: drain rate at %d / at %d = %.2fx", sizes[len(sizes)-1], sizes[0], r)
		b.rep.goal(r >= 0.9, "drain rate at the largest backlog >= 0.9x the smallest: %.2fx", r)
	}
	return nil
}
