//go:build cluster

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
)

// Elasticsearch with replicas loses a node mid-drain: SIGKILL the node
// holding the index's primary shard, then the elected master. The relay
// reports the outage, dead-letters nothing, resumes, and the index ends
// equal to the database; a client whose first URL is the dead node keeps
// working meanwhile.
func TestClusterNodeLoss(t *testing.T) {
	for _, victim := range []string{"primary", "master"} {
		t.Run("a SIGKILL of the node holding the "+victim+" in the middle of a 50,000-event drain loses nothing", func(t *testing.T) {
			e := newClusterEnv(t)
			r := e.startRelay(t, e.dbURL)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// 26,000 events before the kill and 24,000 from the kill on
			// (each writer's share whole transactions of 100). The relay
			// drains the first part while the test waits for the replica
			// below, for as long as that takes: written all at once, the
			// 50,000 events could be acknowledged before the kill, leaving
			// nothing to deliver while the node is gone.
			first := e.write(ctx, e.pool, 4, 26000, 5000, "s", 15*time.Millisecond)
			waitFor(t, "10,000 events are acknowledged", 3*time.Minute, func() bool { return r.sum("outboxd_acknowledged_events_total") >= 10000 })

			// Both copies started: a replica still recovering when the
			// primary dies leaves no in-sync copy, and the shard waits for
			// the dead node to come back.
			greenFrom, ackedFrom := time.Now(), r.sum("outboxd_acknowledged_events_total")
			e.esAny(t, "GET", "/_cluster/health/"+e.index+"-*?wait_for_status=green&timeout=60s", "")
			t.Logf("the index was green %s after 10,000 acknowledgements; the relay acknowledged %.0f events meanwhile",
				time.Since(greenFrom).Round(100*time.Millisecond), r.sum("outboxd_acknowledged_events_total")-ackedFrom)
			node := e.nodeOf(t, victim)
			signals := func() float64 {
				m := r.metrics("outboxd_bulk_request_seconds_count")
				return r.sum("outboxd_sink_errors_total") + m[`{result="unreachable"}`] + m[`{result="http_error"}`] +
					r.metrics("outboxd_events_total")[`{index="`+e.index+`",outcome="retried",stream="default"}`]
			}
			errsBefore := signals()
			acked := r.sum("outboxd_acknowledged_events_total")
			second := e.write(ctx, e.pool, 4, 24000, 5000, "s", 15*time.Millisecond)
			written := func() int64 { return first.written.Load() + second.written.Load() }
			t.Logf("killing node %d (%s) with %d events written, %.0f acknowledged, backlog %d; 24,000 more are being written",
				node, victim, written(), acked, backlog(e.pool, e.schema))
			killed := time.Now()
			services(t, "kill-es-node", strconv.Itoa(node))
			t.Cleanup(func() { services(t, "start-es") }) // a no-op once the node is back

			// The outage as the relay reports it (/readyz), and as it lives
			// it: the longest time without a new acknowledgement while
			// events were waiting.
			var notReady atomic.Bool
			var lastNotReady, stall atomic.Int64
			stopWatch := make(chan struct{})
			watched := make(chan struct{})
			var timeline strings.Builder // one line a second, logged if the test fails
			go func() {
				defer close(watched)
				last, lastAt, sampled := acked, killed, time.Time{}
				for {
					select {
					case <-stopWatch:
						return
					case <-time.After(100 * time.Millisecond):
						ready := r.ready()
						if !ready {
							notReady.Store(true)
							lastNotReady.Store(int64(time.Since(killed)))
						}
						n, b := r.sum("outboxd_acknowledged_events_total"), backlog(e.pool, e.schema)
						if n > last {
							last, lastAt = n, time.Now()
						} else if b > 0 && int64(time.Since(lastAt)) > stall.Load() {
							stall.Store(int64(time.Since(lastAt)))
						}
						if time.Since(sampled) >= time.Second {
							sampled = time.Now()
							fmt.Fprintf(&timeline, "  +%5.1fs acknowledged %6.0f backlog %6d written %6d ready %-5v failed requests and retries %.0f\n",
								time.Since(killed).Seconds(), n, b, written(), ready, signals()-errsBefore)
						}
					}
				}
			}()
			var stopOnce sync.Once
			stop := func() { stopOnce.Do(func() { close(stopWatch); <-watched }) }
			t.Cleanup(func() {
				stop()
				if t.Failed() {
					t.Logf("after the kill of node %d:\n%s", node, timeline.String())
					t.Logf("shards:\n%s", e.esAnyQuiet("GET", "/_cat/shards/"+e.index+"-*?v", ""))
					t.Logf("cluster health: %s", e.esAnyQuiet("GET", "/_cluster/health", ""))
				}
			})
			waitFor(t, "the relay acknowledges events again", 2*time.Minute, func() bool {
				return r.sum("outboxd_acknowledged_events_total") > acked+1000
			})

			urls := []string{e.esURLs[node-1]}
			for i, u := range e.esURLs {
				if i != node-1 {
					urls = append(urls, u)
				}
			}
			t.Run("a relay starts with the dead node first or second in its list", func(t *testing.T) {
				// It stands by (the first relay leads); started means it
				// checked the server and the index spec (one request each,
				// each may land on the dead node) and serves /metrics.
				for _, list := range [][]string{urls, {urls[1], urls[0], urls[2]}} {
					p := e.startRelay(t, e.dbURL, "--elasticsearch-url", strings.Join(list, ","))
					waitFor(t, "the relay serves /metrics", time.Minute, func() bool {
						return !p.alive() || len(p.metrics("go_goroutines")) > 0
					})
					if !p.alive() {
						t.Fatalf("the relay with %v exited at start", list)
					}
					p.kill()
				}
			})
			t.Run("a client whose first URL is the dead node keeps writing", func(t *testing.T) {
				applied, calls := sinkWrites(t, urls, e.index+"-client", 20)
				t.Logf("first URL dead: %d of 20 batches applied on the first call (%d calls)", applied, calls)
				if applied < 10 {
					t.Fatalf("only %d of 20 batches were applied on the first call with the first URL dead", applied)
				}
			})

			time.Sleep(time.Until(killed.Add(5 * time.Second)))
			restart := time.Now()
			services(t, "start-es")
			rejoin := time.Since(restart)
			first.wg.Wait()
			second.wg.Wait()
			converge, v := e.converge(t, e.pool, 4*time.Minute)
			stop()
			errs := signals() - errsBefore
			outage := time.Duration(lastNotReady.Load())
			t.Logf("node loss (%s): %d events written; /readyz not ready at times until %s after the kill (the node was restarted %s after it, rejoining took %s); longest stall without an acknowledgement %s; failed requests and retries counted %.0f; converged %s after the kill (%s after the writers ended); comparison %+v",
				victim, written(), outage.Round(100*time.Millisecond), restart.Sub(killed).Round(time.Second), rejoin.Round(100*time.Millisecond), time.Duration(stall.Load()).Round(100*time.Millisecond),
				errs, time.Since(killed).Round(100*time.Millisecond), converge.Round(100*time.Millisecond), v)
			if stalled := time.Duration(stall.Load()); errs == 0 && !notReady.Load() {
				if stalled > 2*time.Second {
					t.Fatalf("the relay made no progress for %s and did not report it: no failed request or retry counted, /readyz always ready", stalled)
				}
				t.Log("the node loss was invisible to the relay: no request failed, nothing to report")
			}
			if !r.alive() {
				t.Fatal("the relay exited")
			}
		})
	}
}

// sinkWrites writes batches of 50 events through a sink on urls, retrying
// a batch until applied, and returns how many batches went through on the
// first call and the number of calls.
func sinkWrites(t *testing.T, urls []string, index string, batches int) (firstTry, calls int) {
	t.Helper()
	client, err := indexer.NewClient(indexer.ClientConfig{Addresses: urls, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := indexer.NewSink(indexer.Options{Client: client, IndexSpec: []byte(`{"settings":{"number_of_shards":1,"number_of_replicas":1}}`)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", urls[len(urls)-1]+"/"+index+"-*", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	ctx := context.Background()
	for b := 0; b < batches; b++ {
		events := make([]outbox.Event, 50)
		for i := range events {
			events[i] = outbox.Event{IndexName: index, SourceID: fmt.Sprintf("c%d-%d", b, i), Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(`{"x":1}`)}
		}
		for attempt := 0; ; attempt++ {
			calls++
			outs, err := s.Write(ctx, events)
			ok := err == nil
			for _, o := range outs {
				ok = ok && (o.Status == outbox.Applied || o.Status == outbox.Stale)
			}
			if ok {
				if attempt == 0 {
					firstTry++
				}
				break
			}
			if attempt > 30 {
				t.Fatalf("batch %d not applied after %d calls: %v %+v", b, attempt, err, outs)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return firstTry, calls
}

// The sink spreads its requests over every node URL it is given.
func TestClusterClientSpreadsRequests(t *testing.T) {
	e := newClusterEnv(t)
	var counts [3]atomic.Int64
	urls := make([]string, 3)
	for i, u := range e.esURLs[:3] {
		target, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		rp := httputil.NewSingleHostReverseProxy(target)
		i := i
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			counts[i].Add(1)
			rp.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		urls[i] = srv.URL
	}
	sinkWrites(t, urls, e.index, 30)
	for i := range counts {
		t.Logf("node %d received %d requests", i+1, counts[i].Load())
		if counts[i].Load() < 5 {
			t.Fatalf("node %d received %d requests of the sink's; want them spread over every node", i+1, counts[i].Load())
		}
	}
}
