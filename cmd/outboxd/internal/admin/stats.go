package admin

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/relay"
)

// statsCache shares one Stats query between concurrent and closely
// following callers: Stats scans the backlog, and a page, a scraper and the
// sampler asking at once must not each do that.
type statsCache struct {
	fetch func(ctx context.Context) (*relay.Stats, error)
	ttl   time.Duration

	mu   sync.Mutex // held during a fetch, so waiters get its result
	at   time.Time
	took time.Duration // how long the last fetch ran
	st   *relay.Stats
	err  error
}

// The backlog count reads every event behind each stream (0.2 s for two
// streams 300,000 events behind, and it grows with the backlog), and the
// sampler alone asked every 5 s: during a big backlog, when the relay
// needs the server most, that was several percent of a PostgreSQL core.
// A fetch is therefore not run again sooner than statsCostFactor times
// its last duration (2% of one core at most), nor later than statsMaxAge
// because of it.
const (
	statsCostFactor = 50
	statsMaxAge     = time.Minute
)

func (c *statsCache) get(ctx context.Context) (*relay.Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.maxAge() {
		return c.st, c.err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	c.st, c.err = c.fetch(ctx)
	c.at = time.Now()
	c.took = c.at.Sub(start)
	return c.st, c.err
}

// maxAge is how long a fetched Stats is served: the TTL, or longer after
// a slow fetch.
func (c *statsCache) maxAge() time.Duration {
	return max(c.ttl, min(statsCostFactor*c.took, statsMaxAge))
}

var (
	backlogDesc = prometheus.NewDesc("outboxd_backlog_events",
		"Committed outbox events the stream has not acknowledged yet.", []string{"stream"}, nil)
	oldestDesc = prometheus.NewDesc("outboxd_oldest_unacked_age_seconds",
		"Age of the stream's oldest unacknowledged event; 0 when the backlog is empty.", []string{"stream"}, nil)
	parkedDesc = prometheus.NewDesc("outboxd_dead_letters_parked",
		"Dead letters waiting for an operator (status parked), by index.", []string{"index"}, nil)
	statsUpDesc = prometheus.NewDesc("outboxd_stats_up",
		"1 when the backlog statistics could be read from PostgreSQL at this scrape, else 0.", nil, nil)
)

// statsCollector turns Stats into gauges at scrape time, so the backlog
// is visible from every replica, leader or not.
type statsCollector struct{ cache *statsCache }

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backlogDesc
	ch <- oldestDesc
	ch <- parkedDesc
	ch <- statsUpDesc
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.cache.get(context.Background())
	if err != nil || st == nil {
		ch <- prometheus.MustNewConstMetric(statsUpDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(statsUpDesc, prometheus.GaugeValue, 1)
	for _, s := range st.Streams {
		ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(s.Backlog), s.Stream)
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, s.OldestAge, s.Stream)
	}
	for _, d := range st.DeadLetters {
		ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(d.Parked), d.Index)
	}
}
