package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/webhook"
)

// The proof of the notification guarantees: relay processes with different
// destination sets, SIGKILLed and cut off from PostgreSQL in the middle of
// a request, destinations added and removed while messages flow, and
// receivers that apply a message and then answer 500, 502 or 504, hang or
// reset. Every request is checked by a Standard Webhooks verifier written
// here from the specification. The short run is part of the default test
// suite; OUTBOXD_PROOF_MESSAGES=10000 runs the long one.

const proofChildEnv = "OUTBOXD_WEBHOOK_PROOF_CHILD"

// proofChildSpec is what a relay child process serves.
type proofChildSpec struct {
	Schema       string            `json:"schema"`
	App          string            `json:"app"` // application_name of its sessions
	Destinations []string          `json:"destinations"`
	Env          map[string]string `json:"env"`
}

func runProofChild(raw string) int {
	var c proofChildSpec
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = c.App
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var dests []webhook.Destination
	for _, spec := range c.Destinations {
		d, err := webhook.ParseDestination(spec, func(k string) string { return c.Env[k] })
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		d.MaxAttempts, d.BackoffBase, d.BackoffMax = 6, 10*time.Millisecond, 100*time.Millisecond
		dests = append(dests, d)
	}
	return runRelayChild(ctx, pool, c.Schema, dests...)
}

// verifyStandardWebhook is the Standard Webhooks verification as the
// specification states it, independent of package webhook: the secret is
// "whsec_" and base64; the signed content is "id.timestamp.body"; the
// header holds space-separated "v1,<base64 HMAC-SHA256>" signatures; the
// timestamp is within five minutes.
func verifyStandardWebhook(secret string, h http.Header, body []byte, now time.Time) bool {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || !strings.HasPrefix(secret, "whsec_") {
		return false
	}
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || id == "" || now.Sub(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Split(h.Get("webhook-signature"), " ") {
		if v, value, ok := strings.Cut(sig, ","); ok && v == "v1" && hmac.Equal([]byte(value), []byte(want)) {
			return true
		}
	}
	return false
}

// proofReceiver applies a message (counts an effect per webhook-id) and
// then, by the number of the request, answers 200, 500, 502, 504, hangs
// past the client's timeout, or resets; every 43rd request is answered 429
// before any effect. A dedupe receiver applies a webhook-id once.
type proofReceiver struct {
	*httptest.Server
	name, secret string
	dedupe       bool
	onRequest    func(n int) // called with the fleet-wide request number, before the answer

	mu       sync.Mutex
	requests int
	effects  map[string]int
	badSigs  int
}

func newProofReceiver(t *testing.T, name, secret string, dedupe bool, total *proofCounter, closed <-chan struct{}) *proofReceiver {
	r := &proofReceiver{name: name, secret: secret, dedupe: dedupe, effects: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		if !verifyStandardWebhook(r.secret, req.Header, body, time.Now()) {
			r.mu.Lock()
			r.badSigs++
			r.mu.Unlock()
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		key := req.Header.Get("webhook-id")
		r.mu.Lock()
		r.requests++
		n := r.requests
		if n%43 == 0 {
			r.mu.Unlock()
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		if !r.dedupe || r.effects[key] == 0 {
			r.effects[key]++
		}
		r.mu.Unlock()
		if r.onRequest != nil {
			r.onRequest(total.next())
		}
		switch {
		case n%23 == 0:
			http.Error(w, "failed after the commit", http.StatusInternalServerError)
		case n%29 == 0:
			http.Error(w, "bad gateway", http.StatusBadGateway)
		case n%31 == 0:
			http.Error(w, "gateway timeout", http.StatusGatewayTimeout)
		case n%37 == 0:
			select {
			case <-req.Context().Done():
			case <-closed:
			}
		case n%41 == 0:
			cut(w, "")
		default:
			_, _ = w.Write([]byte(`{"ok":true}`))
		}
	}))
	t.Cleanup(func() { r.CloseClientConnections(); r.Close() })
	return r
}

type proofCounter struct {
	mu sync.Mutex
	n  int
}

func (c *proofCounter) next() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return c.n
}

func TestWebhookProof(t *testing.T) {
	t.Parallel()
	n := 300
	if v := os.Getenv("OUTBOXD_PROOF_MESSAGES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 30 {
			t.Fatalf("OUTBOXD_PROOF_MESSAGES=%q: want a number of at least 30", v)
		}
	}
	ctx := context.Background()
	e := setup(t)
	secret := func(s string) string { return "whsec_" + base64.StdEncoding.EncodeToString([]byte(s)) }
	env := map[string]string{"A": secret("proof-a-secret"), "B_NEW": secret("proof-b-new"), "B_OLD": secret("proof-b-old"), "C": secret("proof-c-secret")}
	closed := make(chan struct{})
	total := &proofCounter{}
	// b's receiver still verifies with the secret being rotated out.
	rcvs := map[string]*proofReceiver{
		"a": newProofReceiver(t, "a", env["A"], false, total, closed),
		"b": newProofReceiver(t, "b", env["B_OLD"], false, total, closed),
		"c": newProofReceiver(t, "c", env["C"], true, total, closed),
	}
	t.Cleanup(func() { close(closed) })
	spec := map[string]string{
		"a": "a=" + rcvs["a"].URL + "/services/T0/proof-a,secret_env=A,timeout=300ms",
		// b's check skips every 17th message: nothing is sent for those.
		"b": "b=" + rcvs["b"].URL + ",secret_env=B_NEW,previous_secret_env=B_OLD,timeout=300ms,check=SELECT $1::text <> '' AND ($2::jsonb->>'n')::int % 17 <> 0",
		"c": "c=" + rcvs["c"].URL + ",secret_env=C,idempotent=true,timeout=300ms",
	}

	var mu sync.Mutex
	children := map[string]*exec.Cmd{}
	startChild := func(name string, dests ...string) {
		var specs []string
		for _, d := range dests {
			specs = append(specs, spec[d])
		}
		raw, _ := json.Marshal(proofChildSpec{Schema: e.schema, App: "proof-" + name + "-" + e.schema, Destinations: specs, Env: env})
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), proofChildEnv+"="+string(raw))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		children[name] = cmd
		mu.Unlock()
	}
	kill := func(name string) {
		mu.Lock()
		cmd := children[name]
		delete(children, name)
		mu.Unlock()
		if cmd != nil {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
		}
	}
	t.Cleanup(func() {
		mu.Lock()
		names := make([]string, 0, len(children))
		for k := range children {
			names = append(names, k)
		}
		mu.Unlock()
		for _, k := range names {
			kill(k)
		}
	})
	terminated := 0
	terminate := func() {
		var k int
		err := e.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name LIKE 'proof-r_-' || $1`, e.schema).Scan(&k)
		if err != nil {
			t.Errorf("terminate the relays' sessions: %v", err)
		}
		terminated += k
	}
	// The fleet's life, driven by the receivers' request numbers: each
	// step happens while that request is in flight (its effect applied,
	// its answer not yet written).
	k1, k2, k3, k4 := n/10, n/6, n/5, n/4
	var fleet sync.Mutex // one step at a time; guards events
	events := []string{}
	on := func(req int) {
		fleet.Lock()
		defer fleet.Unlock()
		switch req {
		case k1: // a relay dies mid-request; one that also serves c joins
			kill("r1")
			startChild("r3", "a", "b", "c")
			events = append(events, fmt.Sprintf("request %d: SIGKILL r1 {a,b}, start r3 {a,b,c}", req))
		case k2:
			terminate()
			events = append(events, fmt.Sprintf("request %d: terminated %d PostgreSQL sessions of the relays", req, terminated))
		case k3: // b is removed from the fleet but r3; a relay without a joins
			kill("r2")
			startChild("r4", "b", "c")
			events = append(events, fmt.Sprintf("request %d: SIGKILL r2 {a}, start r4 {b,c}", req))
		case k4: // the relay that serves everything dies mid-request and is replaced
			kill("r3")
			startChild("r5", "a", "b", "c")
			events = append(events, fmt.Sprintf("request %d: SIGKILL r3 {a,b,c}, start r5 {a,b,c}", req))
		}
	}
	for _, r := range rcvs {
		r.onRequest = on
	}
	startChild("r1", "a", "b")
	startChild("r2", "a")

	// Messages for a, b and c, in chunks; c has no relay until r3 starts.
	const chunk = 100
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		if _, err := e.pool.Exec(ctx, `SELECT "`+e.schema+`".append_message((ARRAY['a','b','c'])[g % 3 + 1], 'm' || g, jsonb_build_object('n', g))
			FROM generate_series($1::int, $2::int) g`, lo, hi); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60*time.Second + time.Duration(n)*20*time.Millisecond)
	var final, open int
	for {
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state NOT IN ('reserved', 'retrying')), count(*) FILTER (WHERE state IN ('reserved', 'retrying'))
			FROM "`+e.schema+`".deliveries`).Scan(&final, &open); err != nil {
			t.Fatal(err)
		}
		if final == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Later fleet steps may not have come (too few requests): say so.
	fleet.Lock()
	defer fleet.Unlock()
	for _, ev := range events {
		t.Log(ev)
	}
	if len(events) < 4 {
		t.Logf("only %d of 4 fleet steps happened (%d requests)", len(events), total.next()-1)
	}

	ledger := e.all(t)
	unknown, err := webhook.List(ctx, e.pool, e.schema, webhook.Filter{State: webhook.StateUnknown, Limit: n + 1})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, d := range unknown {
		listed[d.DedupeKey] = true
	}
	states := map[string]map[string]int{}
	var twoEffects, noRow, notAnswerFailed, unlisted, reserved int
	for g := 1; g <= n; g++ {
		key, dest := fmt.Sprintf("m%d", g), []string{"a", "b", "c"}[g%3]
		d, ok := ledger[key]
		if !ok {
			noRow++
			t.Errorf("%s/%s: committed, and no ledger row", dest, key)
			continue
		}
		if states[dest] == nil {
			states[dest] = map[string]int{}
		}
		states[dest][d.State]++
		r := rcvs[dest]
		r.mu.Lock()
		effects := r.effects[key]
		r.mu.Unlock()
		if !r.dedupe && effects > 1 {
			twoEffects++
			t.Errorf("%s/%s: %d effects on a receiver that does not dedupe (state %s: %s)", dest, key, effects, d.State, d.LastError)
		}
		if d.State == webhook.StateSkipped && effects != 0 {
			t.Errorf("%s/%s: skipped, and applied %d times", dest, key, effects)
		}
		switch d.State {
		case webhook.StateDelivered, webhook.StateSkipped:
		case webhook.StateFailed:
			if d.LastStatus == nil || *d.LastStatus < 400 || *d.LastStatus >= 500 || *d.LastStatus == 408 || *d.LastStatus == 429 {
				notAnswerFailed++
				t.Errorf("%s/%s: failed, not by a receiver's refusal: %s", dest, key, d.LastError)
			}
		case webhook.StateUnknown:
			if !listed[key] {
				unlisted++
				t.Errorf("%s/%s: unknown and not listed", dest, key)
			}
		default:
			reserved++
			t.Errorf("%s/%s: still %s after the run: %s", dest, key, d.State, d.LastError)
		}
	}
	badSigs := 0
	for _, r := range rcvs {
		badSigs += r.badSigs
	}
	if badSigs != 0 {
		t.Errorf("%d requests failed the independent Standard Webhooks verification", badSigs)
	}
	t.Logf("%d messages, %d requests, %d final, %d reserved; states %v", n, total.next()-1, final, open, states)
	t.Logf("violations: %d keys with two effects, %d without a ledger row, %d failed not by an answer, %d unknown unlisted, %d not final; %d bad signatures",
		twoEffects, noRow, notAnswerFailed, unlisted, reserved, badSigs)
}
