package relay

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the relay's own instruments. Names are part of the operator
// interface (dashboard, Grafana JSON, alert rules): change them only with
// those.
type metrics struct {
	events        *prometheus.CounterVec   // stream, index, outcome
	deadLetters   *prometheus.CounterVec   // stream, index
	sinkErrors    *prometheus.CounterVec   // stream
	readErrors    *prometheus.CounterVec   // stream
	progressErrs  *prometheus.CounterVec   // stream
	writeSeconds  *prometheus.HistogramVec // stream
	lagSeconds    *prometheus.HistogramVec // stream
	leader        *prometheus.GaugeVec     // stream
	lastCycle     *prometheus.GaugeVec     // stream
	progressXID   *prometheus.GaugeVec     // stream
	ackedEvents   *prometheus.CounterVec   // stream
	pagesInFlight *prometheus.GaugeVec     // stream
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_events_total",
			Help: "Events by sink outcome: applied, stale (duplicate or older than the index), retried (transient failure, will retry), rejected (permanent), deadlettered.",
		}, []string{"stream", "index", "outcome"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_dead_letters_total",
			Help: "Events parked in dead_letters by the relay.",
		}, []string{"stream", "index"}),
		sinkErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_sink_errors_total",
			Help: "Whole-batch sink failures (sink unreachable); the batch is retried with backoff.",
		}, []string{"stream"}),
		readErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_read_errors_total",
			Help: "Failed reads of the outbox; retried with backoff.",
		}, []string{"stream"}),
		progressErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_progress_errors_total",
			Help: "Failures to persist progress; the relay stops the stream when this happens.",
		}, []string{"stream"}),
		writeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outboxd_sink_write_seconds",
			Help:    "Duration of one Sink.Write call.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"stream"}),
		lagSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outboxd_commit_to_applied_seconds",
			Help:    "Time from an event's insert to its terminal outcome at the sink.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}, []string{"stream"}),
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_leader",
			Help: "1 while this process leads the stream, 0 while it stands by.",
		}, []string{"stream"}),
		lastCycle: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_last_cycle_timestamp_seconds",
			Help: "Unix time of the stream's last successful read-deliver-persist cycle.",
		}, []string{"stream"}),
		progressXID: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_progress_xid",
			Help: "The stream's acknowledged position: xmax of its done snapshot.",
		}, []string{"stream"}),
		ackedEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_acknowledged_events_total",
			Help: "Events whose outcome is persisted in progress.",
		}, []string{"stream"}),
		pagesInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_pages_in_flight",
			Help: "Pages read ahead and not yet acknowledged.",
		}, []string{"stream"}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.deadLetters, m.sinkErrors, m.readErrors, m.progressErrs, m.writeSeconds,
			m.lagSeconds, m.leader, m.lastCycle, m.progressXID, m.ackedEvents, m.pagesInFlight)
	}
	return m
}
