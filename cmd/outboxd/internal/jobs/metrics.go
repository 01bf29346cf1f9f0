package jobs

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	runs     *prometheus.CounterVec
	failures *prometheus.CounterVec
	skips    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_job_runs_total",
			Help: "Scheduled job runs this process performed (it held the job's lock), successful or not.",
		}, []string{"job_name"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_job_failures_total",
			Help: "Scheduled job runs that returned an error or panicked.",
		}, []string{"job_name"}),
		skips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_job_skips_total",
			Help: "Scheduled job ticks skipped because another replica held the job's lock.",
		}, []string{"job_name"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outboxd_job_duration_seconds",
			Help:    "Duration of scheduled job runs.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
		}, []string{"job_name"}),
	}
	if reg != nil {
		m.runs = register(reg, m.runs)
		m.failures = register(reg, m.failures)
		m.skips = register(reg, m.skips)
		m.duration = register(reg, m.duration)
	}
	return m
}

// register reuses an identical collector already on reg, so two
// schedulers sharing a registry (tests, a restart in-process) count into
// the same series instead of panicking.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err)
	}
	return c
}
