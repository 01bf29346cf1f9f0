package admin

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// readiness is /readyz's body.
type readiness struct {
	Ready   bool              `json:"ready"`
	Failing []string          `json:"failing,omitempty"`
	Checks  map[string]string `json:"checks"`
	// Role per stream this process may lead: leader or standby. Both are
	// ready: a standby takes over when the leader goes.
	Role map[string]string `json:"role,omitempty"`
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	res := readiness{Ready: true, Checks: map[string]string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, check := range s.cfg.Ready {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
			defer cancel()
			err := check(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Ready = false
				res.Failing = append(res.Failing, name)
				res.Checks[name] = "failing: " + s.cfg.Redact(err.Error())
				return
			}
			res.Checks[name] = "ok"
		}()
	}
	wg.Wait()
	sort.Strings(res.Failing)
	if s.cfg.Role != nil {
		res.Role = map[string]string{}
		for stream, leads := range s.cfg.Role() {
			res.Role[stream] = roleName(leads)
		}
	}
	code := http.StatusOK
	if !res.Ready {
		code = http.StatusServiceUnavailable
		w.Header().Set("X-Outboxd-Failing", strings.Join(res.Failing, ","))
	}
	writeJSON(w, code, res)
}
