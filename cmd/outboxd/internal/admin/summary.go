package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/rebuild"
	"github.com/outboxd/outboxd/relay"
)

// Outcomes the relay counts in outboxd_events_total, in page order.
var outcomeNames = []string{"applied", "stale", "retried", "rejected", "deadlettered"}

// writeSideMetrics are the example API's counters (the brief's write-side
// monitoring); shown when this process registers them.
var writeSideMetrics = map[string]string{
	"outboxd_idempotency_key_hits_total":              "idempotency_key_hits",
	"outboxd_idempotency_duplicate_requests_total":    "duplicate_requests",
	"outboxd_idempotency_payload_conflicts_total":     "payload_conflicts",
	"outboxd_idempotency_in_progress_conflicts_total": "in_progress_conflicts",
	"outboxd_unique_key_conflicts_total":              "unique_key_conflicts",
}

// counters is what the page needs from the Gatherer, summed over streams.
type counters struct {
	byIndex        map[string]map[string]float64 // index -> outcome -> events
	sinkErrors     float64
	readErrors     float64
	progressErrors float64
	lagSum         float64
	lagCount       float64
	lastCycle      map[string]float64 // stream -> unix seconds
	writeSide      map[string]float64
	messages       map[string]*MessageView // destination -> ledger counts
	oldestReserved map[string]float64      // destination -> seconds
	circuitSince   map[string]float64      // destination -> unix seconds its open circuit opened
}

func (c *counters) outcomes() map[string]float64 {
	out := map[string]float64{}
	for _, o := range c.byIndex {
		for k, v := range o {
			out[k] += v
		}
	}
	return out
}

func readCounters(g prometheus.Gatherer) (*counters, error) {
	mfs, err := g.Gather()
	c := &counters{byIndex: map[string]map[string]float64{}, lastCycle: map[string]float64{}}
	if err != nil && len(mfs) == 0 {
		return nil, err
	}
	for _, mf := range mfs {
		name := mf.GetName()
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch name {
			case "outboxd_events_total":
				idx := labels["index"]
				if strings.HasPrefix(idx, outbox.MessagePrefix) {
					// Webhook messages are reported by ledger state only
					// (outboxd_messages_total): their relay outcomes say
					// nothing of the receiver's answer, and the unrouted
					// stream passes every routed message through.
					continue
				}
				if c.byIndex[idx] == nil {
					c.byIndex[idx] = map[string]float64{}
				}
				c.byIndex[idx][labels["outcome"]] += m.GetCounter().GetValue()
			case "outboxd_sink_errors_total":
				c.sinkErrors += m.GetCounter().GetValue()
			case "outboxd_read_errors_total":
				c.readErrors += m.GetCounter().GetValue()
			case "outboxd_progress_errors_total":
				c.progressErrors += m.GetCounter().GetValue()
			case "outboxd_commit_to_applied_seconds":
				c.lagSum += m.GetHistogram().GetSampleSum()
				c.lagCount += float64(m.GetHistogram().GetSampleCount())
			case "outboxd_last_cycle_timestamp_seconds":
				c.lastCycle[labels["stream"]] = m.GetGauge().GetValue()
			case "outboxd_messages_total":
				c.message(labels["destination"]).add(labels["state"], m.GetGauge().GetValue())
			case "outboxd_messages_oldest_reserved_seconds":
				c.message(labels["destination"]).OldestReserved = m.GetGauge().GetValue()
			case "outboxd_webhook_circuit_open":
				// This process's breaker: set by the relay that leads the
				// destination's stream, so that is the page to show it.
				if m.GetGauge().GetValue() > 0 {
					c.message(labels["destination"]).CircuitOpen = true
				}
			case "outboxd_webhook_circuit_opened_timestamp_seconds":
				if c.circuitSince == nil {
					c.circuitSince = map[string]float64{}
				}
				c.circuitSince[labels["destination"]] = m.GetGauge().GetValue()
			default:
				if key, ok := writeSideMetrics[name]; ok {
					if c.writeSide == nil {
						c.writeSide = map[string]float64{}
					}
					c.writeSide[key] += m.GetCounter().GetValue()
				}
			}
		}
	}
	for dest, v := range c.messages {
		if v.CircuitOpen {
			v.CircuitOpenSince = c.circuitSince[dest]
		}
	}
	return c, nil
}

func (c *counters) message(dest string) *MessageView {
	if c.messages == nil {
		c.messages = map[string]*MessageView{}
	}
	v, ok := c.messages[dest]
	if !ok {
		v = &MessageView{Destination: dest}
		c.messages[dest] = v
	}
	return v
}

// MessageView is one webhook destination's row: its messages in the
// delivery ledger by state.
type MessageView struct {
	Destination    string  `json:"destination"`
	Waiting        float64 `json:"waiting"` // no live relay serves the destination
	Reserved       float64 `json:"reserved"`
	Retrying       float64 `json:"retrying"` // parked between attempts until their next one
	Delivered      float64 `json:"delivered"`
	Failed         float64 `json:"failed"`
	Skipped        float64 `json:"skipped"`
	Unknown        float64 `json:"unknown"`
	OldestReserved float64 `json:"oldest_reserved_seconds"`
	// CircuitOpen: this process's breaker paused the destination (its
	// receiver keeps failing; the messages wait) since CircuitOpenSince,
	// in Unix seconds.
	CircuitOpen      bool    `json:"circuit_open"`
	CircuitOpenSince float64 `json:"circuit_open_since,omitempty"`
}

func (v *MessageView) add(state string, n float64) {
	switch state {
	case "waiting":
		v.Waiting += n
	case "reserved":
		v.Reserved += n
	case "retrying":
		v.Retrying += n
	case "delivered":
		v.Delivered += n
	case "failed":
		v.Failed += n
	case "skipped":
		v.Skipped += n
	case "unknown":
		v.Unknown += n
	}
}

// Summary is /api/summary: everything the page shows, in one response.
type Summary struct {
	GeneratedAt    time.Time               `json:"generated_at"`
	StatsError     string                  `json:"stats_error,omitempty"`
	Totals         Totals                  `json:"totals"`
	Streams        []StreamView            `json:"streams"`
	Indexes        []IndexView             `json:"indexes"`
	DeadLetters    []relay.DeadLetterStats `json:"dead_letters"`
	Errors         map[string]float64      `json:"errors"`
	WriteSide      map[string]float64      `json:"write_side,omitempty"`
	Messages       []MessageView           `json:"messages"`
	Jobs           []jobs.Status           `json:"jobs"`
	Rebuilds       []rebuild.Status        `json:"rebuilds"`
	History        []Sample                `json:"history"`
	SampleInterval float64                 `json:"sample_interval_seconds"`
	Outcomes       map[string]float64      `json:"outcomes"`
}

// Totals are the page's headline figures.
type Totals struct {
	Backlog        int64   `json:"backlog"`
	OldestAge      float64 `json:"oldest_age_seconds"`
	Parked         int64   `json:"dead_letters_parked"`
	Retained       int64   `json:"events_retained"`
	Streams        int     `json:"streams"`
	LeaderlessLive int     `json:"streams_without_leader"` // abandoned streams excluded
	Abandoned      int     `json:"streams_abandoned"`
	LeadingHere    int     `json:"streams_led_here"`
}

// StreamView is a stream as the page shows it.
type StreamView struct {
	relay.StreamStats
	Role      string  `json:"role"` // leader, standby, or "" for a stream this process does not serve
	LastCycle float64 `json:"last_cycle_age_seconds,omitempty"`
}

// IndexView is one row of the per-index table.
type IndexView struct {
	Index        string  `json:"index"`
	Applied      float64 `json:"applied"`
	Stale        float64 `json:"stale"`
	Retried      float64 `json:"retried"`
	Rejected     float64 `json:"rejected"`
	DeadLettered float64 `json:"deadlettered"`
	Parked       int64   `json:"parked"`
	LastReason   string  `json:"last_reason,omitempty"`
}

func (s *Server) buildSummary(ctx context.Context, since int64) *Summary {
	now := time.Now()
	sum := &Summary{
		GeneratedAt:    now,
		Errors:         map[string]float64{},
		Outcomes:       map[string]float64{},
		Streams:        []StreamView{},
		Indexes:        []IndexView{},
		DeadLetters:    []relay.DeadLetterStats{},
		Jobs:           []jobs.Status{},
		Messages:       []MessageView{},
		Rebuilds:       []rebuild.Status{},
		History:        s.history.since(since),
		SampleInterval: s.cfg.SampleInterval.Seconds(),
	}
	if sum.History == nil {
		sum.History = []Sample{}
	}
	c, err := readCounters(s.cfg.Gatherer)
	if err != nil {
		s.log.Warn("admin: cannot gather metrics", "err", err)
		c = &counters{byIndex: map[string]map[string]float64{}, lastCycle: map[string]float64{}}
	}
	sum.Errors["sink"], sum.Errors["read"], sum.Errors["progress"] = c.sinkErrors, c.readErrors, c.progressErrors
	sum.WriteSide = c.writeSide
	for _, v := range c.messages {
		sum.Messages = append(sum.Messages, *v)
	}
	sort.Slice(sum.Messages, func(a, b int) bool { return sum.Messages[a].Destination < sum.Messages[b].Destination })
	for _, o := range outcomeNames {
		sum.Outcomes[o] = 0
	}
	for k, v := range c.outcomes() {
		sum.Outcomes[k] = v
	}

	role := map[string]bool{}
	if s.cfg.Role != nil {
		role = s.cfg.Role()
	}
	indexes := map[string]*IndexView{}
	view := func(name string) *IndexView {
		if v, ok := indexes[name]; ok {
			return v
		}
		v := &IndexView{Index: name}
		indexes[name] = v
		return v
	}
	for idx, o := range c.byIndex {
		v := view(idx)
		v.Applied, v.Stale, v.Retried, v.Rejected, v.DeadLettered = o["applied"], o["stale"], o["retried"], o["rejected"], o["deadlettered"]
	}

	st, err := s.stats.get(ctx)
	if err != nil {
		sum.StatsError = s.cfg.Redact(err.Error())
	}
	if s.cfg.Rebuilds != nil {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		if rb, err := s.cfg.Rebuilds(rctx); err != nil {
			s.log.Warn("admin: cannot read rebuilds", "err", s.cfg.Redact(err.Error()))
		} else if rb != nil {
			sum.Rebuilds = rb
		}
		cancel()
	}
	seen := map[string]bool{}
	if st != nil {
		sum.Totals.Retained = st.Events
		for _, ss := range st.Streams {
			v := StreamView{StreamStats: ss}
			if leads, ok := role[ss.Stream]; ok {
				v.Role = roleName(leads)
			}
			if t, ok := c.lastCycle[ss.Stream]; ok && t > 0 {
				v.LastCycle = now.Sub(time.Unix(0, int64(t*1e9))).Seconds()
			}
			seen[ss.Stream] = true
			sum.Streams = append(sum.Streams, v)
			sum.Totals.Backlog += ss.Backlog
			sum.Totals.OldestAge = max(sum.Totals.OldestAge, ss.OldestAge)
			switch {
			case ss.Abandoned:
				// Left behind by a change of partitions, stream or
				// indexes: nobody should lead it, but it holds
				// retention back until dropped.
				sum.Totals.Abandoned++
			case ss.LeaderPID == 0:
				sum.Totals.LeaderlessLive++
			}
		}
		for _, d := range st.DeadLetters {
			sum.DeadLetters = append(sum.DeadLetters, d)
			sum.Totals.Parked += d.Parked
			v := view(d.Index)
			v.Parked, v.LastReason = d.Parked, d.LastReason
		}
	}
	// A stream this process serves that has no progress row yet.
	for name, leads := range role {
		if !seen[name] {
			sum.Streams = append(sum.Streams, StreamView{StreamStats: relay.StreamStats{Stream: name}, Role: roleName(leads)})
		}
		if leads {
			sum.Totals.LeadingHere++
		}
	}
	sort.Slice(sum.Streams, func(a, b int) bool { return sum.Streams[a].Stream < sum.Streams[b].Stream })
	sum.Totals.Streams = len(sum.Streams)
	for _, v := range indexes {
		sum.Indexes = append(sum.Indexes, *v)
	}
	sort.Slice(sum.Indexes, func(a, b int) bool { return sum.Indexes[a].Index < sum.Indexes[b].Index })
	if s.cfg.Jobs != nil {
		sum.Jobs = s.cfg.Jobs()
		for i := range sum.Jobs {
			sum.Jobs[i].LastError = s.cfg.Redact(sum.Jobs[i].LastError)
		}
	}
	return sum
}

func roleName(leads bool) string {
	if leads {
		return "leader"
	}
	return "standby"
}

func (s *Server) summary(w http.ResponseWriter, r *http.Request) {
	since, _ := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64)
	writeJSON(w, http.StatusOK, s.buildSummary(r.Context(), since))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
