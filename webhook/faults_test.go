package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/webhook"
)

// TestWebhookFaults sends many messages to a receiver that fails in every
// way a webhook receiver does, while the relay process is SIGKILLed again
// and again, and checks the delivery guarantees message by message.
func TestWebhookFaults(t *testing.T) {
	t.Parallel()
	n := 10000
	if raceEnabled || testing.Short() {
		n = 2000
	}
	f := faults{err500: 0.05, err429: 0.01, hang: 0.01, cutHeaders: 0.01, cutBody: 0.01, drop: 0.01, hangFor: time.Second, retryAfterSeconds: 1}

	t.Run("an idempotent receiver sees exactly one effect per message", func(t *testing.T) {
		t.Parallel()
		e, rcv, keys := faultRun(t, n, true, f)
		_, effects, badSigs := rcv.snapshot()
		ds := e.all(t)
		for _, k := range keys {
			d := ds[k]
			if effects[k] != 1 || d.State != webhook.StateDelivered {
				t.Errorf("%s: %d effects, state %s (%s)", k, effects[k], d.State, d.LastError)
			}
		}
		if badSigs != 0 {
			t.Errorf("%d requests failed signature verification", badSigs)
		}
	})

	t.Run("a non-idempotent receiver never sees two effects, and every uncertain message is unknown", func(t *testing.T) {
		t.Parallel()
		e, rcv, keys := faultRun(t, n, false, f)
		_, effects, badSigs := rcv.snapshot()
		ds := e.all(t)
		states := map[string]int{}
		for _, k := range keys {
			d := ds[k]
			states[d.State]++
			switch {
			case effects[k] > 1:
				t.Errorf("%s: %d effects", k, effects[k])
			case d.State == webhook.StateDelivered && effects[k] != 1:
				t.Errorf("%s: delivered with %d effects", k, effects[k])
			case d.State != webhook.StateDelivered && d.State != webhook.StateUnknown:
				t.Errorf("%s: state %s (%s)", k, d.State, d.LastError)
			case d.State == webhook.StateUnknown && !d.Uncertain:
				t.Errorf("%s: unknown but not marked uncertain", k)
			}
		}
		unknown, err := webhook.List(context.Background(), e.pool, e.schema, webhook.Filter{State: webhook.StateUnknown, Limit: n})
		if err != nil || len(unknown) != states[webhook.StateUnknown] {
			t.Errorf("list --state unknown gave %d rows (%v), want %d", len(unknown), err, states[webhook.StateUnknown])
		}
		if badSigs != 0 {
			t.Errorf("%d requests failed signature verification", badSigs)
		}
		t.Logf("states: %v", states)
	})
}

func (e *env) all(t *testing.T) map[string]webhook.Delivery {
	t.Helper()
	ds, err := webhook.List(context.Background(), e.pool, e.schema, webhook.Filter{Limit: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]webhook.Delivery, len(ds))
	for _, d := range ds {
		out[d.DedupeKey] = d
	}
	return out
}

// faultRun appends n messages (every 50th key twice) while killing relay
// child processes, then lets a last relay finish every message.
func faultRun(t *testing.T, n int, idempotent bool, f faults) (*env, *receiver, []string) {
	t.Helper()
	ctx := context.Background()
	e := setup(t)
	rcv := newReceiver(t, idempotent, f)
	spec, _ := json.Marshal(childSpec{Schema: e.schema, URL: rcv.URL, Idempotent: idempotent})
	child := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		const chunk = 500
		for lo := 1; lo <= n; lo += chunk {
			hi := min(lo+chunk-1, n)
			_, err := e.pool.Exec(ctx, `SELECT "`+e.schema+`".append_message('hook', 'm' || g, jsonb_build_object('n', g))
				FROM generate_series($1::int, $2::int) g`, lo, hi)
			if err == nil {
				_, err = e.pool.Exec(ctx, `SELECT "`+e.schema+`".append_message('hook', 'm' || g, jsonb_build_object('n', g, 'again', true))
					FROM generate_series($1::int, $2::int) g WHERE g % 50 = 0`, lo, hi)
			}
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	const kills = 5
	for range kills {
		cmd := child()
		time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
	}
	wg.Wait()

	cmd := child()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	began := time.Now()
	deadline := began.Add(100 * time.Second)
	for {
		var final, open int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state NOT IN ('reserved', 'retrying')), count(*) FILTER (WHERE state IN ('reserved', 'retrying'))
			FROM "`+e.schema+`".deliveries`).Scan(&final, &open); err != nil {
			t.Fatal(err)
		}
		if final == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d kills: %d of %d messages final, %d still reserved or retrying", kills, final, n, open)
		}
		time.Sleep(100 * time.Millisecond)
	}
	requests, _, _ := rcv.snapshot()
	total := 0
	for _, r := range requests {
		total += r
	}
	t.Logf("%d messages (+%d duplicate appends) through %d SIGKILLs: %d requests; last relay finished in %s",
		n, n/50, kills, total, time.Since(began).Round(time.Millisecond))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("m%d", i+1)
	}
	return e, rcv, keys
}
