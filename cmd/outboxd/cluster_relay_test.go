//go:build cluster

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
)

// Three relay processes share 6 partitions. Two are SIGKILLed: the
// survivor leads all 6 within the lease interval plus 1 s. Restarted, the
// leadership spreads back over the three within 10 s. Throughout, the
// index never goes back to a lower version of any document.
func TestClusterRelaysAcrossHosts(t *testing.T) {
	e := newClusterEnv(t)
	relays := make([]*relayProc, 3)
	for i := range relays {
		relays[i] = e.startRelay(t, e.dbURL, "--partitions", "6")
	}
	// Seven streams (six partitions and webhook-unrouted, which every
	// relay has) over three relays: a fair share is 3, so each relay leads
	// 1 to 3 streams and all six partitions are led.
	spread := func(rs []*relayProc) func() bool {
		return func() bool {
			total := 0
			for _, r := range rs {
				if n := r.leading(true); n < 1 || n > 3 {
					return false
				}
				total += r.leads()
			}
			return total == 6
		}
	}
	waitFor(t, "the three relays share the 6 partitions", 30*time.Second, spread(relays))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := e.write(ctx, e.pool, 4, 30000, 300, "r", 40*time.Millisecond)
	regressions := watchVersions(ctx, t, e, 300)
	waitFor(t, "events flow", time.Minute, func() bool {
		var n float64
		for _, r := range relays {
			n += r.sum("outboxd_acknowledged_events_total")
		}
		return n > 3000
	})

	// The killed relays' sessions end when PostgreSQL reads their closed
	// sockets; from then on the takeover is the relays' own doing.
	names := make([]string, 6)
	if ps, err := relay.Partitions("default", 6); err == nil {
		for i, p := range ps {
			names[i] = p.Name
		}
	}
	mine := relays[0].ledStreams()
	dead := map[int]bool{}
	ls, err := relay.Leaders(ctx, e.pool, e.schema, names)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if !mine[l.Stream] && l.PID != 0 {
			dead[l.PID] = true
		}
	}
	killed := time.Now()
	relays[1].kill()
	relays[2].kill()
	reaped := waitFor(t, "PostgreSQL ends the killed relays' sessions", 30*time.Second, func() bool {
		ls, err := relay.Leaders(ctx, e.pool, e.schema, names)
		if err != nil {
			return false
		}
		for _, l := range ls {
			if dead[l.PID] {
				return false
			}
		}
		return true
	})
	takeover := waitFor(t, "the survivor leads all 6 streams", 10*time.Second, func() bool { return relays[0].leads() == 6 })
	t.Logf("SIGKILL of two relays: PostgreSQL ended their sessions after %s; the survivor led all 6 streams %s later (%s after the kill)",
		reaped.Round(10*time.Millisecond), takeover.Round(10*time.Millisecond), time.Since(killed).Round(10*time.Millisecond))
	if takeover > 2*time.Second {
		t.Fatalf("takeover took %s after the sessions ended, want at most the lease interval (1s) plus 1s", takeover)
	}

	relays[1] = e.startRelay(t, e.dbURL, "--partitions", "6")
	relays[2] = e.startRelay(t, e.dbURL, "--partitions", "6")
	rebalance := waitFor(t, "the leadership spreads back over the three relays", 30*time.Second, spread(relays))
	t.Logf("restart of two relays: spread back %s after their start", rebalance.Round(10*time.Millisecond))
	if rebalance > 10*time.Second {
		t.Fatalf("rebalancing took %s, want at most 10s", rebalance)
	}

	w.wg.Wait()
	conv, v := e.converge(t, e.pool, 3*time.Minute)
	cancel()
	n := regressions()
	t.Logf("relays across hosts: %d events written, converged %s after the drain (%s after the kill), comparison %+v, version regressions seen %d",
		w.written.Load(), conv.Round(100*time.Millisecond), time.Since(killed).Round(100*time.Millisecond), v, n)
	if n > 0 {
		t.Fatalf("the index went back to a lower version %d times", n)
	}
}

var streamLabel = regexp.MustCompile(`stream="([^"]+)"`)

// ledStreams is the set of streams the relay's outboxd_leader gauge says it leads.
func (p *relayProc) ledStreams() map[string]bool {
	out := map[string]bool{}
	for labels, v := range p.metrics("outboxd_leader") {
		if m := streamLabel.FindStringSubmatch(labels); m != nil && v == 1 {
			out[m[1]] = true
		}
	}
	return out
}

// watchVersions polls the versions of keyspace source ids in the write
// index and counts every time one is lower than an earlier observation.
func watchVersions(ctx context.Context, t *testing.T, e *clusterEnv, keyspace int) (regressions func() int) {
	var mu sync.Mutex
	count := 0
	done := make(chan struct{})
	ids := make([]string, keyspace)
	for i := range ids {
		ids[i] = fmt.Sprintf("%q", fmt.Sprintf("r%d", i))
	}
	body := `{"ids":[` + strings.Join(ids, ",") + `]}`
	go func() {
		defer close(done)
		last := map[string]int64{}
		for ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
			var r struct {
				Docs []struct {
					ID      string `json:"_id"`
					Found   bool   `json:"found"`
					Version int64  `json:"_version"`
				} `json:"docs"`
			}
			// realtime mget reads the latest write, tombstones included.
			if err := json.Unmarshal(e.esAnyQuiet("POST", "/"+e.index+"-write/_mget?_source=false", body), &r); err != nil {
				continue
			}
			for _, d := range r.Docs {
				if !d.Found {
					continue
				}
				if d.Version < last[d.ID] {
					mu.Lock()
					count++
					mu.Unlock()
					t.Logf("version regression: %s went from %d to %d", d.ID, last[d.ID], d.Version)
				}
				last[d.ID] = d.Version
			}
		}
	}()
	return func() int {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return count
	}
}
