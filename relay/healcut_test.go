package relay_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// running is a relay whose Run must not return before the test stops it.
type running struct {
	r      *relay.Relay
	done   chan error
	cancel context.CancelFunc
}

func runUntilStopped(t *testing.T, cfg relay.Config) *running {
	t.Helper()
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rn := &running{r: r, done: make(chan error, 1), cancel: cancel}
	go func() { rn.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-rn.done:
		case <-time.After(30 * time.Second):
		}
	})
	return rn
}

// alive fails the test if Run returned.
func (rn *running) alive(t *testing.T) {
	t.Helper()
	select {
	case err := <-rn.done:
		rn.done <- err
		t.Fatalf("Run returned while it should heal: %v", err)
	default:
	}
}

// stop shuts the relay down and fails on an error from Run.
func (rn *running) stop(t *testing.T) {
	t.Helper()
	rn.alive(t)
	rn.cancel()
	if err := <-rn.done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	rn.done <- nil
}

// rowDescription matches the server's description of a result with the
// named column.
func rowDescription(column string) func(byte, []byte) bool {
	want := append([]byte(column), 0)
	return func(typ byte, body []byte) bool { return typ == 'T' && bytes.Contains(body, want) }
}

func isProgressStore(sql string) bool {
	return strings.HasPrefix(strings.TrimSpace(sql), "UPDATE") && strings.Contains(sql, "SET done_snapshot")
}

func (e *env) ackedEvents(t *testing.T, stream string) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), `SELECT acked_events FROM "`+e.schema+`".progress WHERE stream = $1`, stream).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRelayHealsWithoutExiting(t *testing.T) {
	t.Parallel()

	t.Run("a connection lost while joining the relays at start is retried, and the relay leads and delivers", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		proxy, pool := newCutProxy(t)
		sink := newRecordingSink()
		cfg := e.config(sink)
		cfg.Pool = pool
		// Cut right after the server describes the join's result: the
		// relay's very first statement.
		cut := proxy.after(1, true, rowDescription("pg_advisory_lock_shared"))
		rn := runUntilStopped(t, cfg)
		waitFired(t, cut, "the cut of the join")
		ids := e.appendTx(t, "a", 10)
		schematest.Eventually(t, 20*time.Second, "every event delivered", func() bool {
			rn.alive(t)
			return sink.has(ids[9]) && e.backlog(t) == 0
		})
		for _, id := range ids {
			if !sink.has(id) {
				t.Fatalf("event %d never delivered", id)
			}
		}
		rn.stop(t)
	})

	t.Run("a connection lost during a progress store gives the stream up and leads it again from the stored position", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		proxy, pool := newCutProxy(t)
		cfg := storeEveryPage(e.config(newRecordingSink()))
		cfg.Pool = pool
		// The server never sees the third store.
		cut := proxy.beforeBind(3, isProgressStore)
		e.roundsAcrossFailedStore(t, cfg, 3, cut)
	})

	t.Run("a progress store whose session is terminated gives the stream up and leads it again from the stored position", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		cfg := storeEveryPage(e.config(newRecordingSink()))
		// The third store's own backend is terminated while it runs.
		failed := e.failNthStore(t, 3, `PERFORM pg_terminate_backend(pg_backend_pid())`)
		e.roundsAcrossFailedStore(t, cfg, 3, nil)
		if !failed() {
			t.Fatal("the third progress store did not fail")
		}
	})

	t.Run("a progress store that fails on a live session gives the stream up and leads it again from the stored position", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		cfg := storeEveryPage(e.config(newRecordingSink()))
		// The third store fails with an error, its session stays open (as
		// with a statement timeout or a server that became read-only).
		failed := e.failNthStore(t, 3, `RAISE EXCEPTION 'this progress store fails for the test'`)
		e.roundsAcrossFailedStore(t, cfg, 3, nil)
		if !failed() {
			t.Fatal("the third progress store did not fail")
		}
	})
}

// storeEveryPage makes every page stored on its own and nothing else
// store: the k-th store is the k-th round's in roundsAcrossFailedStore.
func storeEveryPage(cfg relay.Config) relay.Config {
	cfg.Linger = -1
	cfg.StoreInterval, cfg.ProgressInterval = time.Nanosecond, time.Hour
	return cfg
}

// failNthStore makes the n-th progress store of the test's schema run the
// PL/pgSQL statement fail (which must make it fail). The returned function
// reports whether it ran.
func (e *env) failNthStore(t *testing.T, n int, fail string) (failed func() bool) {
	t.Helper()
	s := `"` + e.schema + `"`
	_, err := e.pool.Exec(context.Background(), `CREATE SEQUENCE `+s+`.test_stores;
		CREATE FUNCTION `+s+`.test_fail_store() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			-- nextval outlives the rollback, so only the n-th store fails.
			IF nextval('`+s+`.test_stores') = `+strconv.Itoa(n)+` THEN
				`+fail+`;
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_fail_store BEFORE UPDATE ON `+s+`.progress FOR EACH ROW EXECUTE FUNCTION `+s+`.test_fail_store()`)
	if err != nil {
		t.Fatal(err)
	}
	return func() bool {
		var last int64
		var called bool
		if err := e.pool.QueryRow(context.Background(), `SELECT last_value, is_called FROM `+s+`.test_stores`).Scan(&last, &called); err != nil {
			t.Fatal(err)
		}
		return called && last >= int64(n)
	}
}

// roundsAcrossFailedStore commits rounds of events, each delivered and
// stored before the next, while the cutRound-th store fails (failed, when
// not nil, is closed then). Run must not return, the stream must be led again, every
// event delivered, and the failed store's round delivered again: it was
// never acknowledged, so the next leadership resumed before it.
func (e *env) roundsAcrossFailedStore(t *testing.T, cfg relay.Config, cutRound int, failed <-chan struct{}) {
	t.Helper()
	const rounds, perRound = 5, 10
	sink := cfg.Sink.(*recordingSink)
	rn := runUntilStopped(t, cfg)
	var all [][]int64
	for round := 1; round <= rounds; round++ {
		ids := e.appendTx(t, string(rune('a'+round)), perRound)
		all = append(all, ids)
		if round == cutRound && failed != nil {
			waitFired(t, failed, "the failed progress store")
		}
		schematest.Eventually(t, 20*time.Second, "the round is delivered and stored", func() bool {
			rn.alive(t)
			return sink.has(ids[perRound-1]) && e.ackedEvents(t, "default") == int64(round*perRound)
		})
	}
	schematest.Eventually(t, 20*time.Second, "the stream is led and the backlog is zero", func() bool {
		rn.alive(t)
		return len(rn.r.Leading()) == 1 && e.backlog(t) == 0
	})
	for i, ids := range all {
		for _, id := range ids {
			if !sink.has(id) {
				t.Fatalf("event %d of round %d never delivered", id, i+1)
			}
		}
	}
	sink.mu.Lock()
	for _, id := range all[cutRound-1] {
		if sink.count[id] < 2 {
			t.Errorf("event %d of the round whose store failed was delivered %d time(s), want again after the stored position", id, sink.count[id])
		}
	}
	sink.mu.Unlock()
	rn.stop(t)
}
