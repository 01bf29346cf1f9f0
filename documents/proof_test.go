package documents_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/backfill"
	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// README, "Documents from several tables": the proof and its figures.
//
// TestProof is the proof that a definition-fed index stays exactly in
// step with three tables under every kind of change, relay crashes and an
// Elasticsearch stall: 8 writers change parents, children (added,
// edited, deleted, moved to another parent), parents deleted and created
// again, and lookup rows shared by about 100 parents each, for
// OUTBOXD_PROOF_SECONDS (default 20), while the initial documents are
// backfilled from the definition. The relay (the built binary) is
// SIGKILLed and started again 3 times, after a number of its bulk
// requests, and every bulk request is held for 5 s once. At the end
// every document equals the definition's result for its id, and a poller
// reading 200 random ids throughout never saw one go back to an older
// state (each document carries the counters the writers bump).
func TestProof(t *testing.T) {
	if testing.Short() {
		t.Skip("the proof runs for OUTBOXD_PROOF_SECONDS (default 20)")
	}
	seconds := 20
	if v := os.Getenv("OUTBOXD_PROOF_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 5 {
			t.Fatalf("OUTBOXD_PROOF_SECONDS: %q, want a whole number of seconds >= 5", v)
		}
		seconds = n
	}
	ctx := context.Background()
	pool, name := schematest.Setup(t)
	e := &env{pool: pool, schema: name, id: pgx.Identifier{name}.Sanitize()}
	x := esSetup(t)
	esURL := schematest.ElasticsearchURL(t)
	e.exec(t, proofTables(e))
	if _, err := documents.Define(ctx, pool, name, documents.DefineOptions{Index: x.name, SQL: proofDefinition(e), IDsSQL: e.sql(`SELECT id FROM {s}.parents`), Operator: "proof"}); err != nil {
		t.Fatal(err)
	}
	for _, w := range [][2]string{{"parents", "id"}, {"children", "parent_id"}, {"lookup", "SELECT p.id FROM {s}.parents p WHERE p.lookup_id = $1.id"}} {
		if _, err := documents.AddWatch(ctx, pool, name, documents.WatchOptions{Index: x.name, Table: e.id + "." + w[0], Key: e.sql(w[1]), Operator: "proof"}); err != nil {
			t.Fatal(err)
		}
	}
	bin := tooltest.BuildOutboxd(t)

	// Killed at the 12th bulk request of its first and second runs and at
	// the 20th of its third, which holds its 6th (and everything sent in
	// the next 5 s) first.
	px := newESProxy(t, esURL, []int64{12, 12, 20}, 6, 5*time.Second)
	relay := startRelayProcess(t, bin, name, px.srv.URL, 0)
	t.Cleanup(func() { relay.kill() })
	wr := startProofWriters(t, e, 8)
	pl := startPoller(t, esURL, x.name, 200)
	t.Cleanup(pl.stop)
	type result struct {
		rep *backfill.Report
		err error
	}
	backfilled := make(chan result, 1)
	go func() {
		sink, err := indexer.NewSink(indexer.Options{Client: x.es, JSONB: true})
		if err != nil {
			backfilled <- result{err: err}
			return
		}
		rep, err := backfill.Run(ctx, backfill.Options{Pool: pool, Schema: name, Sink: sink, Index: x.name})
		backfilled <- result{rep, err}
	}()

	start := time.Now()
	end := time.After(time.Duration(seconds) * time.Second)
	restarts := 0
drive:
	for {
		select {
		case <-px.killReq:
			relay.kill()
			restarts++
			px.restarted()
			px.killDone <- struct{}{}
			relay = startRelayProcess(t, bin, name, px.srv.URL, restarts)
		case <-end:
			break drive
		}
	}
	wr.halt()
	px.stopKilling()
	bf := <-backfilled
	if bf.err != nil {
		t.Fatalf("backfill: %v", bf.err)
	}
	tooltest.WaitBacklog(t, pool, name)
	drained := time.Since(start)
	docs, visible := x.state(t)
	d := compare(t, e.expected(t, x.name, `SELECT id FROM {s}.parents`), docs, visible)
	pl.stop()

	var events, fanouts, deadLetters, parents int64
	if err := pool.QueryRow(ctx, e.sql(`SELECT (SELECT count(*) FROM {s}.events), (SELECT count(*) FROM {s}.events WHERE event_type = 'refresh.watch'),
		(SELECT count(*) FROM {s}.dead_letters), (SELECT count(*) FROM {s}.parents)`)).Scan(&events, &fanouts, &deadLetters, &parents); err != nil {
		t.Fatal(err)
	}
	t.Logf("proof: %ds of writes, drained after %.1fs: %d transactions (%d changes found nothing to change), %d refresh events (%d of them fan-outs of a lookup row), %d relay restarts after SIGKILL, %d Elasticsearch stall, %d bulk requests through the proxy",
		seconds, drained.Seconds(), wr.commits.Load(), wr.skip.Load(), events, fanouts, restarts, px.stalled, px.total.Load())
	for k, n := range proofKinds {
		t.Logf("  %-20s %d", n, wr.byKind[k].Load())
	}
	t.Logf("backfill from the definition meanwhile: %d ids, %d applied, %d stale (a newer refresh was there), %.1fs", bf.rep.Rows, bf.rep.Applied, bf.rep.Stale, bf.rep.Seconds)
	t.Logf("end: %d parents, %d documents behind the write alias; %s; dead letters %d; poller: %d documents read in %d _mget of 200 ids (%d reads of a deleted parent), %d regressions, %d failed requests",
		parents, len(docs), d, deadLetters, pl.reads.Load(), pl.requests.Load(), pl.gone.Load(), len(pl.regressions), pl.errors.Load())
	if !d.zero() {
		t.Errorf("the index differs from the definition: %s", d)
	}
	for i, r := range pl.regressions {
		if i < 10 {
			t.Errorf("poller: %s", r)
		}
	}
	if restarts != 3 || px.stalled != 1 {
		t.Errorf("%d restarts and %d stalls in %ds; want 3 and 1 (give OUTBOXD_PROOF_SECONDS more time)", restarts, px.stalled, seconds)
	}
	if deadLetters != 0 || pl.reads.Load() == 0 || wr.commits.Load() == 0 {
		t.Errorf("dead letters %d, poller reads %d, transactions %d", deadLetters, pl.reads.Load(), wr.commits.Load())
	}
}
