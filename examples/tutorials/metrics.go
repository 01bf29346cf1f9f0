package main

import "github.com/prometheus/client_golang/prometheus"

// metrics are the write-side counters the brief asks operators to watch.
type metrics struct {
	keyHits          prometheus.Counter
	duplicates       prometheus.Counter
	payloadConflicts prometheus.Counter
	uniqueConflicts  prometheus.Counter
	busy             prometheus.Counter
	expiredDeleted   prometheus.Counter
	requests         *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		keyHits: counter("outboxd_idempotency_key_hits_total",
			"Writes answered by replaying the stored response of an earlier request with the same Idempotency-Key and payload."),
		duplicates: counter("outboxd_idempotency_duplicate_requests_total",
			"Writes whose Idempotency-Key was already claimed (retries, double clicks, gateway replays), whatever the answer."),
		payloadConflicts: counter("outboxd_idempotency_payload_conflicts_total",
			"Writes refused with 409 because their Idempotency-Key was used for a different payload."),
		busy: counter("outboxd_idempotency_in_progress_conflicts_total",
			"Writes refused with 409 because a request with the same Idempotency-Key was still being processed."),
		uniqueConflicts: counter("outboxd_unique_key_conflicts_total",
			"Creates that hit the (author_id, request_id) unique constraint and returned the existing record."),
		expiredDeleted: counter("outboxd_idempotency_expired_keys_deleted_total",
			"Idempotency keys removed by the expiry job."),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_api_requests_total",
			Help: "Example API requests by route pattern and HTTP status code.",
		}, []string{"route", "code"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.keyHits, m.duplicates, m.payloadConflicts, m.busy, m.uniqueConflicts, m.expiredDeleted, m.requests} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}
