package webhook

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the sinks' request instruments, shared by every destination
// of a process. A nil *Metrics measures nothing.
type Metrics struct {
	requests *prometheus.CounterVec   // destination, result
	seconds  *prometheus.HistogramVec // destination
	finals   *prometheus.CounterVec   // destination, state
	circuits *circuitGauges           // destination
}

// NewMetrics registers the webhook instruments on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_webhook_requests_total",
			Help: "Webhook requests by result: delivered (2xx), refused (permanent 3xx/4xx), retry (408, 429, not sent; 5xx with retry_5xx), uncertain (written, then a 5xx or no answer).",
		}, []string{"destination", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outboxd_webhook_request_seconds",
			Help:    "Duration of one webhook request.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"destination"}),
		finals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_webhook_messages_finished_total",
			Help: "Messages this process brought to a final ledger state, and duplicates and conflicts (same key, other payload) it refused to send.",
		}, []string{"destination", "state"}),
		circuits: newCircuitGauges(),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.seconds, m.finals, m.circuits)
	}
	return m
}

var resultNames = [...]string{vDelivered: "delivered", vRefused: "refused", vRetry: "retry", vUncertain: "uncertain"}

func (m *Metrics) observe(dest string, a attempt, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(dest, resultNames[a.verdict]).Inc()
	m.seconds.WithLabelValues(dest).Observe(d.Seconds())
}

func (m *Metrics) circuit(dest string, open bool) {
	if m == nil {
		return
	}
	since := 0.0
	if open {
		// A failed probe does not call this again: the time is when the
		// pause began, what the operator page shows as "open since".
		since = float64(time.Now().UnixMilli()) / 1e3
	}
	m.circuits.set(dest, since)
}

// circuitGauges are outboxd_webhook_circuit_open and
// outboxd_webhook_circuit_opened_timestamp_seconds, collected together
// from one state: as two gauges set one after the other, a scrape between
// the two writes could read a circuit open since 0.
type circuitGauges struct {
	open, opened *prometheus.Desc
	mu           sync.Mutex
	since        map[string]float64 // by destination; 0 while closed
}

func newCircuitGauges() *circuitGauges {
	return &circuitGauges{
		open: prometheus.NewDesc("outboxd_webhook_circuit_open",
			"1 while a destination is paused because its receiver keeps failing (breaker_failures consecutive failures); its messages wait.",
			[]string{"destination"}, nil),
		opened: prometheus.NewDesc("outboxd_webhook_circuit_opened_timestamp_seconds",
			"Unix time the destination's open circuit (outboxd_webhook_circuit_open) opened; 0 while it is closed.",
			[]string{"destination"}, nil),
		since: map[string]float64{},
	}
}

func (c *circuitGauges) set(dest string, since float64) {
	c.mu.Lock()
	c.since[dest] = since
	c.mu.Unlock()
}

func (c *circuitGauges) Describe(ch chan<- *prometheus.Desc) { ch <- c.open; ch <- c.opened }

func (c *circuitGauges) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for dest, since := range c.since {
		open := 0.0
		if since > 0 {
			open = 1
		}
		ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, open, dest)
		ch <- prometheus.MustNewConstMetric(c.opened, prometheus.GaugeValue, since, dest)
	}
}

func (m *Metrics) count(dest, state string) {
	if m != nil {
		m.finals.WithLabelValues(dest, state).Inc()
	}
}

// LedgerCollector exports the delivery ledger as gauges read at scrape
// time, so every relay and the operator see the same numbers:
// outboxd_messages_total{destination,state}, outboxd_messages_unknown
// (outcomes waiting for an operator) and
// outboxd_messages_oldest_reserved_seconds{destination} (reserved or
// retrying: not yet final) and outboxd_webhook_waiting{destination}
// (messages no live relay serves).
type LedgerCollector struct {
	pool   *pgxpool.Pool
	schema string // quoted

	total, unknown, oldest, waiting *prometheus.Desc
}

// NewLedgerCollector returns a collector over schema's ledger.
func NewLedgerCollector(pool *pgxpool.Pool, schemaIdent string) *LedgerCollector {
	return &LedgerCollector{
		pool: pool, schema: schemaIdent,
		total:   prometheus.NewDesc("outboxd_messages_total", "Messages in the delivery ledger by destination and state (waiting, reserved, retrying, delivered, failed, skipped, unknown).", []string{"destination", "state"}, nil),
		unknown: prometheus.NewDesc("outboxd_messages_unknown", "Messages whose outcome is unknown, waiting for an operator (outboxd deliveries list --state unknown).", nil, nil),
		oldest:  prometheus.NewDesc("outboxd_messages_oldest_reserved_seconds", "Age of the oldest message still being delivered (reserved, or retrying: parked between attempts), by destination.", []string{"destination"}, nil),
		waiting: prometheus.NewDesc("outboxd_webhook_waiting", "Messages waiting for a relay that serves their destination (none live has it configured), by destination.", []string{"destination"}, nil),
	}
}

func (c *LedgerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.total
	ch <- c.unknown
	ch <- c.oldest
	ch <- c.waiting
}

func (c *LedgerCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.pool.Query(ctx, `SELECT destination, state, count(*),
			coalesce(extract(epoch FROM now() - min(reserved_at) FILTER (WHERE state IN ('reserved', 'retrying'))), 0)
		FROM `+c.schema+`.deliveries GROUP BY destination, state`)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.total, err)
		return
	}
	defer rows.Close()
	var unknown float64
	oldest := map[string]float64{}
	for rows.Next() {
		var dest, state string
		var n int64
		var age float64
		if err := rows.Scan(&dest, &state, &n, &age); err != nil {
			ch <- prometheus.NewInvalidMetric(c.total, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(n), dest, state)
		switch state {
		case StateUnknown:
			unknown += float64(n)
		case StateReserved, StateRetrying:
			oldest[dest] = max(oldest[dest], age)
		case StateWaiting:
			ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(n), dest)
		}
	}
	if rows.Err() != nil {
		ch <- prometheus.NewInvalidMetric(c.total, rows.Err())
		return
	}
	for dest, age := range oldest {
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age, dest)
	}
	ch <- prometheus.MustNewConstMetric(c.unknown, prometheus.GaugeValue, unknown)
}
