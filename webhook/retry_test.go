package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

// reply is how a keyed receiver answers one request.
type reply struct {
	status     int    // 0: apply the message and answer 200
	retryAfter string // with status
	hang       bool   // apply the message, then never answer
}

// keyed is a loopback receiver whose answer to the n-th request (from
// 1) of a key is answer(key, n), called under mu. It verifies signatures
// and counts requests and effects per key; an idempotent one applies a
// key once.
type keyed struct {
	*httptest.Server
	idempotent bool
	answer     func(key string, n int) reply
	onEffect   func(key string) // under mu, after the effect

	mu       sync.Mutex
	requests map[string]int
	effects  map[string]int
	hung     chan string // the key of each request that hangs
}

func newKeyed(t *testing.T, idempotent bool, answer func(key string, n int) reply) *keyed {
	t.Helper()
	r := &keyed{idempotent: idempotent, answer: answer, requests: map[string]int{}, effects: map[string]int{}, hung: make(chan string, 16)}
	stop := make(chan struct{})
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		if err := webhook.Verify(secret, req.Header, body, time.Now(), 0); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		key := req.Header.Get("webhook-id")
		r.mu.Lock()
		r.requests[key]++
		a := r.answer(key, r.requests[key])
		if a.status != 0 {
			r.mu.Unlock()
			if a.retryAfter != "" {
				w.Header().Set("Retry-After", a.retryAfter)
			}
			http.Error(w, "not now", a.status)
			return
		}
		if !r.idempotent || r.effects[key] == 0 {
			r.effects[key]++
		}
		if r.onEffect != nil {
			r.onEffect(key)
		}
		r.mu.Unlock()
		if a.hang {
			r.hung <- key
			select {
			case <-req.Context().Done():
			case <-stop:
			}
			return
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(func() {
		close(stop)
		r.Server.CloseClientConnections()
		r.Server.Close()
	})
	return r
}

func (r *keyed) counts(key string) (requests, effects int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[key], r.effects[key]
}

// TestWebhookParkedMessage: a message whose receiver keeps asking it to
// come back later (429 with a Retry-After, or a 503 that a retry_5xx
// destination may retry) retries in line only within RetryInline, is then
// parked in the ledger, and the destination's later messages are
// delivered meanwhile, within RetryInline and one attempt; the parked
// message is retried from the ledger and delivered once the receiver
// recovers, with one effect per key.
func TestWebhookParkedMessage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		status   int
		retry5xx bool
	}{
		{"a message refused with 429 and Retry-After does not hold back the 50 after it", http.StatusTooManyRequests, false},
		{"a message answered 503 by a retry_5xx destination does not hold back the 50 after it", http.StatusServiceUnavailable, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const others = 50
			ctx := context.Background()
			e := setup(t)
			var (
				recovered   bool
				lastAt      time.Time // when the last of the others was applied
				stuckAtLast int       // and how many requests the stuck one had then
			)
			rcv := newKeyed(t, false, func(key string, n int) reply {
				if key == "stuck" && !recovered {
					return reply{status: c.status, retryAfter: "2"}
				}
				return reply{}
			})
			rcv.onEffect = func(key string) {
				if key != "stuck" && len(rcv.effects)-rcv.effects["stuck"] == others {
					lastAt, stuckAtLast = time.Now(), rcv.requests["stuck"]
				}
			}
			d := destination("hook", rcv.URL, false)
			d.Retry5xx = c.retry5xx
			ss, err := streams(e.pool, e.schema, d)
			if err != nil {
				t.Fatal(err)
			}
			// Pages of 10: the stuck message's page, the two the relay
			// has at the sink with it, and three more behind them.
			cfg := relayConfig(e.pool, e.schema, ss)
			cfg.MaxBatchDocs = 10
			start(t, cfg)

			began := time.Now()
			if _, err := e.pool.Exec(ctx, `SELECT "`+e.schema+`".append_message('hook', CASE WHEN g = 0 THEN 'stuck' ELSE 'm' || g END, jsonb_build_object('n', g))
				FROM generate_series(0, $1::int) g`, others); err != nil {
				t.Fatal(err)
			}
			schematest.Eventually(t, 20*time.Second, fmt.Sprintf("the %d messages after the stuck one are delivered", others), func() bool {
				n := 0
				for k, dl := range e.all(t) {
					if k != "stuck" && dl.State == webhook.StateDelivered {
						n++
					}
				}
				return n == others
			})
			rcv.mu.Lock()
			took, stuckRequests := lastAt.Sub(began), stuckAtLast
			rcv.mu.Unlock()
			// In line, attempts 2 s apart fit 3 in the default 5 s; a
			// retry or two from the ledger, 2 s apart, may come too, but
			// not the 100 attempts of its retry schedule.
			bound := webhook.DefaultRetryInline + d.Timeout
			t.Logf("the %d others were delivered %s after the append (bound %s); the stuck message had %d requests by then", others, took.Round(time.Millisecond), bound, stuckRequests)
			if stuckRequests > 5 {
				t.Errorf("the others waited for %d attempts of the stuck message, want at most 5 (3 in line, then retries from the ledger)", stuckRequests)
			}
			if took > bound+5*time.Second {
				t.Errorf("the others took %s, want about %s at most", took, bound)
			}
			stuck := e.delivery(t, "hook", "stuck")
			if stuck.State != webhook.StateRetrying || stuck.NextAttemptAt == nil || stuck.LastStatus == nil || *stuck.LastStatus != c.status {
				t.Fatalf("stuck: %+v, want retrying with a next attempt and last status %d", stuck, c.status)
			}
			listed, err := webhook.List(ctx, e.pool, e.schema, webhook.Filter{State: webhook.StateRetrying})
			if err != nil || len(listed) != 1 || listed[0].DedupeKey != "stuck" {
				t.Fatalf("list --state retrying: %+v (%v)", listed, err)
			}

			rcv.mu.Lock()
			recovered = true
			rcv.mu.Unlock()
			e.waitState(t, "hook", "stuck", webhook.StateDelivered)
			for k, dl := range e.all(t) {
				if _, effects := rcv.counts(k); effects != 1 || dl.State != webhook.StateDelivered {
					t.Errorf("%s: %d effects, state %s", k, effects, dl.State)
				}
			}
			requests, _ := rcv.counts("stuck")
			t.Logf("the stuck message was delivered at its request %d", requests)
		})
	}
}

// TestWebhookParkedCrash: a relay process SIGKILLed while a message is
// parked, or while a parked message's retry is in flight, loses nothing
// and doubles nothing: the next relay delivers a parked message once, and
// makes a retry cut off mid-request unknown unless the destination is
// idempotent.
func TestWebhookParkedCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	child := func(t *testing.T, spec childSpec) *exec.Cmd {
		t.Helper()
		raw, _ := json.Marshal(spec)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
		})
		return cmd
	}
	kill := func(cmd *exec.Cmd) {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}

	t.Run("a relay killed while a message is parked: the next one delivers it once", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		var recovered bool
		rcv := newKeyed(t, false, func(key string, n int) reply {
			if !recovered {
				return reply{status: http.StatusTooManyRequests, retryAfter: "3600"}
			}
			return reply{}
		})
		cmd := child(t, childSpec{Schema: e.schema, URL: rcv.URL})
		e.send(t, "hook", "p", `{"n":1}`)
		parked := e.waitState(t, "hook", "p", webhook.StateRetrying)
		kill(cmd)
		if parked.Attempts != 1 || parked.NextAttemptAt == nil || time.Until(*parked.NextAttemptAt) < 5*time.Minute {
			t.Fatalf("parked: %+v, want 1 attempt and the next one ten minutes out", parked)
		}
		rcv.mu.Lock()
		recovered = true
		rcv.mu.Unlock()
		// The ten minutes the receiver asked for pass.
		if _, err := e.pool.Exec(ctx, `UPDATE "`+e.schema+`".deliveries SET next_attempt_at = now() WHERE dedupe_key = 'p'`); err != nil {
			t.Fatal(err)
		}
		e.run(t, destination("hook", rcv.URL, false))
		d := e.waitState(t, "hook", "p", webhook.StateDelivered)
		if requests, effects := rcv.counts("p"); requests != 2 || effects != 1 || d.Attempts != 2 || d.NextAttemptAt != nil {
			t.Fatalf("%d requests, %d effects, row %+v; want 2 requests (a 429, then the delivery), 1 effect", requests, effects, d)
		}
	})

	for _, idempotent := range []bool{false, true} {
		name := "a relay killed while a parked message's retry is in flight: not sent again, unknown"
		if idempotent {
			name = "a relay killed while a parked message's retry is in flight: sent again to an idempotent destination, one effect"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			rcv := newKeyed(t, idempotent, func(key string, n int) reply {
				switch n {
				case 1:
					return reply{status: http.StatusTooManyRequests, retryAfter: "1"}
				case 2:
					return reply{hang: true}
				}
				return reply{}
			})
			// Parked at its first retry: the second request is the
			// destination leader's retry from the ledger.
			cmd := child(t, childSpec{Schema: e.schema, URL: rcv.URL, Idempotent: idempotent, RetryInline: -1})
			e.send(t, "hook", "p", `{"n":1}`)
			select {
			case <-rcv.hung:
			case <-time.After(20 * time.Second):
				t.Fatal("the parked message's retry never came")
			}
			kill(cmd)
			if d := e.delivery(t, "hook", "p"); d.State != webhook.StateRetrying || d.Attempts != 2 {
				t.Fatalf("after the kill: %+v, want retrying with its second attempt in flight", d)
			}
			e.run(t, destination("hook", rcv.URL, idempotent))
			want := webhook.StateUnknown
			if idempotent {
				want = webhook.StateDelivered
			}
			d := e.waitState(t, "hook", "p", want)
			requests, effects := rcv.counts("p")
			wantRequests := 2
			if idempotent {
				wantRequests = 3
			}
			if requests != wantRequests || effects != 1 || !d.Uncertain {
				t.Fatalf("%d requests, %d effects, row %+v; want %d requests, 1 effect, uncertain", requests, effects, d, wantRequests)
			}
		})
	}
}
