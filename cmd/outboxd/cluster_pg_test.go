//go:build cluster

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// pgHosts splits the multi-host DATABASE_URL of make test-cluster into a
// URL for the primary alone and one for the standby alone.
func pgHosts(t *testing.T, multi string) (primary, standby string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(multi)
	if err != nil || len(cfg.Fallbacks) == 0 {
		t.Fatalf("DATABASE_URL must name the primary and the standby (OUTBOXD_PG_STANDBY=1): %v", err)
	}
	one := func(host string, port uint16) string {
		return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, host, port, cfg.Database)
	}
	return one(cfg.Host, cfg.Port), one(cfg.Fallbacks[0].Host, cfg.Fallbacks[0].Port)
}

func connect(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// supervised runs a relay under a restart loop, as systemd or Kubernetes
// would: today the relay exits when it loses its PostgreSQL session. Once
// it reconnects by itself the loop simply never restarts it (the test
// logs the number of restarts).
type supervised struct {
	mu       sync.Mutex
	cur      *relayProc
	restarts atomic.Int32
}

func (s *supervised) proc() *relayProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (e *clusterEnv) supervise(ctx context.Context, t *testing.T, dbURL string, extra ...string) *supervised {
	s := &supervised{cur: e.startRelay(t, dbURL, extra...)}
	go func() {
		for {
			p := s.proc()
			select {
			case <-ctx.Done():
				return
			case <-p.done:
			}
			if ctx.Err() != nil {
				return
			}
			s.restarts.Add(1)
			time.Sleep(300 * time.Millisecond)
			s.mu.Lock()
			s.cur = e.startRelay(t, dbURL, extra...)
			s.mu.Unlock()
		}
	}()
	return s
}

// PostgreSQL fails over to its streaming standby in the middle of a drain.
// Replication is asynchronous and the standby's WAL receiver is stopped
// first, so events committed on the old primary and already delivered to
// Elasticsearch never reach the new one: the index is then ahead of the
// database (also where the writers, continuing on the new primary, reuse
// versions the index has seen), and outboxd reconcile --apply brings it
// back to the database's truth.
func TestClusterPostgresFailover(t *testing.T) {
	e := newClusterEnv(t)
	primaryURL, standbyURL := pgHosts(t, e.dbURL)
	// Runs before the schema is dropped: the old primary back, a fresh standby.
	t.Cleanup(func() { services(t, "reset-standby") })
	primary, standby := connect(t, primaryURL), connect(t, standbyURL)
	ctx := context.Background()

	runCtx, stopRelays := context.WithCancel(ctx)
	defer stopRelays()
	relays := []*supervised{
		e.supervise(runCtx, t, e.dbURL, "--partitions", "2"),
		e.supervise(runCtx, t, e.dbURL, "--partitions", "2"),
	}
	wctx, stopWriters := context.WithCancel(ctx)
	w1 := e.write(wctx, e.pool, 4, 12000, 3000, "p", 10*time.Millisecond)
	w1.wg.Wait()
	stopWriters()
	waitFor(t, "the first 12,000 events are delivered", 3*time.Minute, func() bool { return backlog(primary, e.schema) == 0 })

	// The standby has everything so far; then it stops receiving.
	waitFor(t, "the standby replays everything", time.Minute, func() bool {
		var caughtUp bool
		err := standby.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, currentLSN(t, primary)).Scan(&caughtUp)
		return err == nil && caughtUp
	})
	for _, q := range []string{`ALTER SYSTEM SET primary_conninfo = ''`, `SELECT pg_reload_conf()`} {
		if _, err := standby.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the standby's WAL receiver stops", 30*time.Second, func() bool {
		var n int
		return standby.QueryRow(ctx, `SELECT count(*) FROM pg_stat_wal_receiver`).Scan(&n) == nil && n == 0
	})

	// 100 updates of existing sources and 20 new sources, committed and
	// delivered, that the standby will never see.
	var lost []outbox.Event
	for i := 0; i < 100; i++ {
		lost = append(lost, outbox.Event{IndexName: e.index, SourceID: fmt.Sprintf("p%d", i), Op: outbox.OpUpsert, Document: json.RawMessage(`{"lost":true}`)})
	}
	for i := 0; i < 20; i++ {
		lost = append(lost, outbox.Event{IndexName: e.index, SourceID: fmt.Sprintf("lost-%d", i), Op: outbox.OpUpsert, Document: json.RawMessage(`{"lost":true}`)})
	}
	if err := pgx.BeginFunc(ctx, primary, func(tx pgx.Tx) error { _, err := e.ob.AppendBatch(ctx, tx, lost); return err }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lost events are delivered", time.Minute, func() bool { return backlog(primary, e.schema) == 0 })

	// More writers, through the multi-host URL, then the primary dies
	// mid-drain and the standby is promoted.
	wctx, stopWriters = context.WithCancel(ctx)
	defer stopWriters()
	w2 := e.write(wctx, e.pool, 4, 12000, 3000, "q", 20*time.Millisecond)
	waitFor(t, "3,000 more events are written", time.Minute, func() bool { return w2.written.Load() >= 3000 })
	// The relays heal in place: count what they acknowledge from here on.
	procs := [2]*relayProc{relays[0].proc(), relays[1].proc()}
	ackedBefore := [2]float64{procs[0].sum("outboxd_acknowledged_events_total"), procs[1].sum("outboxd_acknowledged_events_total")}
	killed := time.Now()
	services(t, "kill-pg")
	services(t, "promote")
	promoted := time.Since(killed)
	streams := []string{"default-0", "default-1"}
	if ps, err := relay.Partitions("default", 2); err == nil {
		streams = []string{ps[0].Name, ps[1].Name}
	}
	resumed := waitFor(t, "both streams are led on the new primary", time.Minute, func() bool {
		ls, err := relay.Leaders(ctx, e.pool, e.schema, streams)
		return err == nil && ls[0].PID != 0 && ls[1].PID != 0
	})
	w2.wg.Wait()
	waitFor(t, "the new primary's outbox is drained", 3*time.Minute, func() bool { return backlog(e.pool, e.schema) == 0 })
	drained := time.Since(killed)

	// Leadership: one leader per stream, and the two relays' own view agrees.
	waitFor(t, "the relays lead one stream each", 30*time.Second, func() bool {
		return relays[0].proc().leads()+relays[1].proc().leads() == 2
	})
	ls, err := relay.Leaders(ctx, e.pool, e.schema, streams)
	if err != nil || ls[0].PID == 0 || ls[1].PID == 0 {
		t.Fatalf("leaders after the failover: %+v (%v)", ls, err)
	}
	// Continued from the stored position, not from the start of the outbox.
	var total int64
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".events`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	var after float64
	for i := range procs {
		if relays[i].proc() != procs[i] {
			t.Fatalf("relay %d exited across the failover instead of reconnecting", i)
		}
		after += procs[i].sum("outboxd_acknowledged_events_total") - ackedBefore[i]
	}
	if after >= float64(total) {
		t.Fatalf("after the failover the relays acknowledged %.0f events of %d: they started over", after, total)
	}

	// Everything committed after the WAL receiver stopped is gone: the 120
	// events above, delivered, and whatever the writers committed before
	// the kill, delivered or not. The index differs from the database
	// exactly where a lost event was delivered.
	before := e.compare(t, e.pool)
	drift := before.Missing + before.Ahead + before.Extra + before.Resurrected
	t.Logf("before reconcile: %+v", before)
	if drift < 120 || before.Extra < 20 || before.Stale+before.DeadLetters != 0 {
		t.Fatalf("the index should be ahead of the database by at least the 120 lost events, 20 of them extra: %+v", before)
	}

	sql := `SELECT DISTINCT ON (source_id) source_id, version, document, op = 'delete' FROM "` + e.schema + `".events WHERE index_name = '` + e.index + `' ORDER BY source_id, version DESC`
	rep, code := e.reconcile(t, sql, false)
	c := rep.Counts
	if code != 3 || c["ahead"] == 0 || c["ahead"]+c["extra"]+c["resurrected"]+c["missing"] != int64(drift) || c["stale"]+c["duplicate"] != 0 {
		t.Fatalf("reconcile (report only): exit %d, counts %v; want the %d drifts the comparison found, ahead of the database among them", code, c, drift)
	}
	if _, code := e.reconcile(t, sql, true); code != 0 {
		t.Fatalf("reconcile --apply: exit %d", code)
	}
	conv, v := e.converge(t, e.pool, 2*time.Minute)
	if rep, code := e.reconcile(t, sql, false); code != 0 {
		t.Fatalf("reconcile after --apply: exit %d, counts %v", code, rep.Counts)
	}
	stopRelays()
	t.Logf("postgres failover: %d events written, standby promoted %s after the kill, both streams led again %s after the promotion, drained %s after the kill; relay restarts %d+%d (supervised); reconcile found ahead %d, extra %d, resurrected %d, missing %d; converged %s after --apply; comparison %+v",
		total, promoted.Round(10*time.Millisecond), resumed.Round(10*time.Millisecond), drained.Round(100*time.Millisecond),
		relays[0].restarts.Load(), relays[1].restarts.Load(), c["ahead"], c["extra"], c["resurrected"], c["missing"], conv.Round(100*time.Millisecond), v)
}

func backlog(pool *pgxpool.Pool, schemaName string) int64 {
	st, err := relay.CollectStats(context.Background(), pool, schemaName)
	if err != nil {
		return -1
	}
	return st.Backlog()
}

func currentLSN(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var lsn string
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

type reconcileJSON struct {
	Counts map[string]int64 `json:"counts"`
	Events int64            `json:"events"`
}

// reconcile runs the outboxd reconcile command and returns its report and
// exit status.
func (e *clusterEnv) reconcile(t *testing.T, sql string, apply bool) (reconcileJSON, int) {
	t.Helper()
	args := []string{"reconcile", "--database-url", e.dbURL, "--schema", e.schema, "--elasticsearch-url", strings.Join(e.esURLs, ","),
		"--index", e.index, "--source-sql", sql, "--json", "--operator", "cluster-test"}
	if apply {
		args = append(args, "--apply")
	}
	cmd := exec.Command(outboxdBinary(t), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var rep reconcileJSON
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("reconcile output: %v\n%s\n%s", err, out, stderr.String())
	}
	return rep, code
}
