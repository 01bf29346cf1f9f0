package admin

import (
	"context"
	"sync"
	"time"
)

// Sample is one point of the page's charts. Counters are cumulative since
// this process started; the page turns consecutive samples into rates.
type Sample struct {
	T            int64   `json:"t"` // unix milliseconds
	Backlog      int64   `json:"backlog"`
	OldestAge    float64 `json:"oldest_age"`
	Parked       int64   `json:"parked"`
	Applied      float64 `json:"applied"`
	Stale        float64 `json:"stale"`
	Retried      float64 `json:"retried"`
	Rejected     float64 `json:"rejected"`
	DeadLettered float64 `json:"deadlettered"`
	SinkErrors   float64 `json:"sink_errors"`
	LagSum       float64 `json:"lag_sum"`
	LagCount     float64 `json:"lag_count"`
	StatsOK      bool    `json:"stats_ok"`
}

// history is a fixed ring of samples: memory stays bounded however long
// the process runs.
type history struct {
	mu   sync.Mutex
	buf  []Sample
	next int
	full bool
}

func newHistory(n int) *history {
	return &history{buf: make([]Sample, max(n, 2))}
}

func (h *history) add(s Sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buf[h.next] = s
	h.next = (h.next + 1) % len(h.buf)
	if h.next == 0 {
		h.full = true
	}
}

// since returns the samples taken after t (unix ms), oldest first.
func (h *history) since(t int64) []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Sample
	emit := func(part []Sample) {
		for _, s := range part {
			if s.T > t {
				out = append(out, s)
			}
		}
	}
	if h.full {
		emit(h.buf[h.next:])
	}
	emit(h.buf[:h.next])
	return out
}

func (s *Server) sampleLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.SampleInterval)
	defer t.Stop()
	for {
		s.history.add(s.takeSample(ctx))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) takeSample(ctx context.Context) Sample {
	smp := Sample{T: time.Now().UnixMilli()}
	if st, err := s.stats.get(ctx); err == nil && st != nil {
		smp.StatsOK = true
		smp.Backlog = st.Backlog()
		smp.OldestAge = st.OldestBacklogAge().Seconds()
		for _, d := range st.DeadLetters {
			smp.Parked += d.Parked
		}
	}
	if c, err := readCounters(s.cfg.Gatherer); err == nil {
		o := c.outcomes()
		smp.Applied, smp.Stale, smp.Retried, smp.Rejected, smp.DeadLettered =
			o["applied"], o["stale"], o["retried"], o["rejected"], o["deadlettered"]
		smp.SinkErrors = c.sinkErrors
		smp.LagSum, smp.LagCount = c.lagSum, c.lagCount
	} else {
		s.log.Warn("admin: cannot gather metrics for the history", "err", err)
	}
	return smp
}
