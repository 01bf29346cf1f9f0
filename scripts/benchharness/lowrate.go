package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// The lowrate scenario's rates: the cost per event at a trickle against
// the cost near full use, and the latency goal's rate.
const (
	lowRate  = 500
	latRate  = 1000
	highRate = 5000
)

type lowResult struct {
	rate      int
	events    int
	achieved  float64
	window    time.Duration // production plus the tail's delivery
	relayCPU  time.Duration
	pgCPU     time.Duration
	backends  int
	bulks     int64 // _bulk requests the relay sent, counted by the proxy
	indexOps  int64 // the bench index's bulk operations by its own stats, -1 if unknown
	p50, p99  time.Duration
	p999, max time.Duration

	bulkP50, bulkP99 time.Duration // Elasticsearch's own answer time
	bulkMax          time.Duration
	bulkSlow         int // answers of slowAnswer or longer
}

// cpuPerK is CPU milliseconds (relay + its backends) per 1,000 events.
func (r lowResult) cpuPerK() float64 {
	return float64(r.relayCPU+r.pgCPU) / 1e6 / float64(r.events) * 1000
}

// lowrateScenario runs `outboxd relay` against paced producers at a
// trickle, at the latency goal's rate and near full use, and charges it
// its own CPU and its PostgreSQL backends' per 1,000 events.
func (b *bench) lowrateScenario(ctx context.Context) error {
	proxy, err := b.startESProxy()
	if err != nil {
		return err
	}
	defer proxy.close()
	b.rep.line("outboxd relay %s-> proxy -> Elasticsearch; %d producer connections (%d above 1,000/s), one Outbox.Append per transaction (several above 1,000/s), %s per rate",
		relayArgsShown(b.cfg.relayArgs), b.cfg.lowWorkers, b.cfg.highWorkers, b.cfg.lowDuration)
	// The phases: a trickle, the latency goal's rate with the defaults and
	// with --linger 0 (latency first), near full use.
	type phase struct {
		rate  int
		label string
		extra []string
	}
	phases := []phase{{lowRate, "", nil}, {latRate, "", nil}, {latRate, " --linger 0", []string{"--linger", "0"}}, {highRate, "", nil}}
	res := make([]lowResult, len(phases))
	for i, ph := range phases {
		r, err := b.lowratePhase(ctx, proxy, ph.rate, ph.extra...)
		if err != nil {
			return fmt.Errorf("%d events/s%s: %w", ph.rate, ph.label, err)
		}
		res[i] = r
		ops := "?"
		if r.indexOps >= 0 {
			ops = fmt.Sprintf("%.1f/s", float64(r.indexOps)/r.window.Seconds())
		}
		b.rep.key("lowrate %d/s%s: %d events at %.0f/s; CPU relay %.0f ms + PostgreSQL %.0f ms (%d backends) = %.1f ms per 1,000 events; %.1f _bulk requests/s (index bulk stats %s); commit->ES ack p50 %s p99 %s (p99.9 %s, max %s; of which Elasticsearch's answer to a _bulk p50 %s p99 %s max %s, %d answers of %s or more) (load avg %s)",
			ph.rate, ph.label, r.events, r.achieved, float64(r.relayCPU)/1e6, float64(r.pgCPU)/1e6, r.backends, r.cpuPerK(),
			float64(r.bulks)/r.window.Seconds(), ops, ms(r.p50), ms(r.p99), ms(r.p999), ms(r.max), ms(r.bulkP50), ms(r.bulkP99), ms(r.bulkMax), r.bulkSlow, ms(slowAnswer), loadAvg())
	}
	lo, lat, lat0, hi := res[0], res[1], res[2], res[3] // in the order of phases
	ratio := lo.cpuPerK() / hi.cpuPerK()
	b.rep.goal(ratio <= 1.5, "CPU per 1,000 events at %d/s <= 1.5x at %d/s: %.1f / %.1f ms = %.2fx", lowRate, highRate, lo.cpuPerK(), hi.cpuPerK(), ratio)
	bps := float64(lo.bulks) / lo.window.Seconds()
	b.rep.goal(bps <= 20, "_bulk requests at %d events/s <= 20/s: %.1f/s", lowRate, bps)
	b.rep.goal(lat.p99 <= 25*time.Millisecond, "p99 commit -> acknowledged by Elasticsearch at %d/s <= 25 ms: %s", latRate, ms(lat.p99))
	b.rep.goal(lat0.p99 <= 10*time.Millisecond, "p99 commit -> acknowledged by Elasticsearch at %d/s with --linger 0 <= 10 ms: %s", latRate, ms(lat0.p99))
	return nil
}

func (b *bench) lowratePhase(ctx context.Context, proxy *esProxy, rate int, extra ...string) (lowResult, error) {
	cfg := b.cfg
	w, err := b.startWarmRelay(ctx, proxy, int(float64(rate)*cfg.lowDuration.Seconds()), extra...)
	if err != nil {
		return lowResult{}, err
	}
	defer w.close()
	index, ob, at, p := w.index, w.ob, w.at, w.p

	meter := newCPUMeter(p.pid(), b.pool)
	meter.begin(ctx)
	mctx, stopMeter := context.WithCancel(ctx)
	defer stopMeter()
	go meter.run(mctx, 100*time.Millisecond)
	bulks0, ops0 := proxy.bulks.Load(), b.indexBulkOps(ctx, index)
	start := time.Now()
	// Above 1,000/s a transaction carries several events: single-event
	// transactions stop near 2,000/s on this machine (PostgreSQL's commit
	// CPU), and the relay's cost per event is what is compared.
	per := perTx(rate)
	txs, took, err := pace(ctx, rate/per, cfg.lowDuration, cfg.producers(rate), func(g int64) error {
		first := (g-1)*int64(per) + 1
		if err := b.appendEvents(ctx, ob, index, first, per); err != nil {
			return err
		}
		now := time.Now().UnixNano()
		for i := range int64(per) {
			at.commit[first+i].Store(now)
		}
		return nil
	})
	n := txs * per
	if err != nil {
		return lowResult{}, err
	}
	if err := at.waitAcked(ctx, int64(n)+1, 30*time.Second, p); err != nil {
		return lowResult{}, err
	}
	window := time.Since(start)
	stopMeter()
	relayCPU, pgCPU, nb := meter.end(ctx)
	r := lowResult{rate: rate, events: n, achieved: float64(n) / took.Seconds(), window: window,
		relayCPU: relayCPU, pgCPU: pgCPU, backends: nb, bulks: proxy.bulks.Load() - bulks0, indexOps: -1}
	r.bulkP50, r.bulkP99, r.bulkMax, r.bulkSlow = proxy.bulkTimes(start)
	if ops0 >= 0 {
		if ops1 := b.indexBulkOps(ctx, index); ops1 >= 0 {
			r.indexOps = ops1 - ops0
		}
	}
	if _, err := p.stop(30 * time.Second); err != nil {
		return lowResult{}, err
	}

	lat := make([]time.Duration, 0, n)
	for g := 1; g < len(at.commit); g++ {
		c, a := at.commit[g].Load(), at.ack[g].Load()
		if c == 0 {
			continue
		}
		// A bulk answer can arrive before the producer's COMMIT returns
		// to it; that counts as zero.
		lat = append(lat, max(time.Duration(a-c), 0))
	}
	if len(lat) == 0 {
		return lowResult{}, fmt.Errorf("no events measured")
	}
	slices.Sort(lat)
	r.p50, r.p99, r.p999, r.max = pct(lat, 0.5), pct(lat, 0.99), pct(lat, 0.999), lat[len(lat)-1]
	b.deleteIndices(ctx, index)
	b.dropSchema(ctx, w.schema)
	return r, nil
}

// indexBulkOps is the shard-level bulk operations Elasticsearch counted on
// index's indices (a cross-check of the proxy's count; -1 if unavailable).
func (b *bench) indexBulkOps(ctx context.Context, index string) int64 {
	res, err := b.es.Indices.Stats(b.es.Indices.Stats.WithContext(ctx), b.es.Indices.Stats.WithIndex(index+"-*"),
		b.es.Indices.Stats.WithMetric("bulk"))
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	if res.IsError() {
		return -1
	}
	var st struct {
		All struct {
			Primaries struct {
				Bulk *struct {
					TotalOperations int64 `json:"total_operations"`
				} `json:"bulk"`
			} `json:"primaries"`
		} `json:"_all"`
	}
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil || st.All.Primaries.Bulk == nil {
		return -1
	}
	return st.All.Primaries.Bulk.TotalOperations
}

// idleScenario runs `outboxd relay` with nothing to deliver and charges it
// its own CPU and its PostgreSQL backends' as a share of one core.
func (b *bench) idleScenario(ctx context.Context) error {
	proxy, err := b.startESProxy()
	if err != nil {
		return err
	}
	defer proxy.close()
	w, err := b.startWarmRelay(ctx, proxy, 1)
	if err != nil {
		return err
	}
	defer w.close()
	p := w.p
	time.Sleep(b.cfg.idleSettle)

	meter := newCPUMeter(p.pid(), b.pool)
	meter.begin(ctx)
	mctx, stopMeter := context.WithCancel(ctx)
	defer stopMeter()
	// Sampling is the harness's cost, not the relay's, but its queries
	// run on the same server: sample gently.
	go meter.run(mctx, time.Second)
	requests0 := proxy.requests.Load()
	start := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-p.exited:
		return fmt.Errorf("outboxd relay exited: %v: %s", p.err, p.log.String())
	case <-time.After(b.cfg.idleDuration):
	}
	window := time.Since(start)
	stopMeter()
	relayCPU, pgCPU, nb := meter.end(ctx)
	if _, err := p.stop(30 * time.Second); err != nil {
		return err
	}
	pctOf := func(d time.Duration) float64 { return 100 * d.Seconds() / window.Seconds() }
	total := pctOf(relayCPU + pgCPU)
	b.rep.key("idle: %s with nothing to deliver, from %s after the last event: relay %.0f ms (%.2f%%) + PostgreSQL %.0f ms (%.2f%%, %d backends) = %.2f%% of one core; %d requests to Elasticsearch (load avg %s)",
		window.Round(time.Second), b.cfg.idleSettle, float64(relayCPU)/1e6, pctOf(relayCPU), float64(pgCPU)/1e6, pctOf(pgCPU), nb, total,
		proxy.requests.Load()-requests0, loadAvg())
	b.rep.goal(total <= 1, "idle CPU (relay + its PostgreSQL backends) <= 1%% of one core: %.2f%%", total)
	return nil
}

// producers is how many connections pace a rate: the goal's 8 writers up to
// 1,000/s; above, single-event transactions need more connections than that
// to reach the rate at all, and the relay's cost per event is the subject.
func (c *config) producers(rate int) int {
	if rate > 1000 {
		return max(c.lowWorkers, c.highWorkers)
	}
	return c.lowWorkers
}

// perTx is how many events one producer transaction commits at rate.
func perTx(rate int) int {
	return max(1, (rate+999)/1000)
}
