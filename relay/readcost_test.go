package relay

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// A destination's stream (and the unrouted one) reads in proportion to
// its own messages: with 100k search events and 10 messages in the outbox,
// the page query's plan uses the message index and removes no search
// events by filter.
func TestMessageStreamReadUsesTheMessageIndex(t *testing.T) {
	t.Parallel()
	pool, name := schematest.Setup(t)
	ctx := context.Background()
	id := pgx.Identifier{name}.Sanitize()
	if _, err := pool.Exec(ctx, `INSERT INTO `+id+`.events (index_name, source_id, version, op, document)
		SELECT 'search-docs', 'doc-' || g, 1, 'upsert', '{}' FROM generate_series(1, 100000) g`); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := pool.Exec(ctx, `SELECT `+id+`.append_message('hook', $1, '{}')`, fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+id+`.events`); err != nil {
		t.Fatal(err)
	}
	for _, s := range []Stream{
		{Name: "webhook-hook", BucketHi: 1023, Indexes: []string{outbox.MessageIndex("hook")}},
		{Name: "webhook-unrouted", BucketHi: 1023, Indexes: []string{outbox.MessagePrefix + "*"}},
	} {
		r := &reader{pool: pool, schema: id, stream: s, maxDocs: 8000, maxBytes: 4 << 20, pos: position{done: emptySnapshot}}
		plan := explainPage(t, pool, r, r.pos)
		t.Logf("stream %s:\n%s", s.Name, plan)
		if !strings.Contains(plan, "events_messages") {
			t.Errorf("stream %s: the plan does not use the message index:\n%s", s.Name, plan)
		}
		if strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Rows Removed by Filter: 100000") {
			t.Errorf("stream %s: the plan scans the search events:\n%s", s.Name, plan)
		}
		// The read itself returns the stream's 10 messages.
		p, err := r.next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.events) != 10 {
			t.Errorf("stream %s: read %d events, want 10", s.Name, len(p.events))
		}
	}
	// A destination with 5,000 delivered messages: a poll looks up the
	// late committers' xids, it does not walk the destination's messages.
	if _, err := pool.Exec(ctx, `INSERT INTO `+id+`.events (index_name, source_id, version, op, document)
		SELECT $1, 'm-' || g, 1, 'upsert', '{}' FROM generate_series(1, 5000) g`, outbox.MessageIndex("hook")); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+id+`.events`); err != nil {
		t.Fatal(err)
	}
	// A transaction that wrote nothing, listed as in progress at done and
	// finished since: the late-committer branch looks it up.
	var late uint64
	if err := pool.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&late); err != nil {
		t.Fatal(err)
	}
	now := currentSnapshot(t, pool)
	r := &reader{pool: pool, schema: id, stream: Stream{Name: "webhook-hook", BucketHi: 1023, Indexes: []string{outbox.MessageIndex("hook")}},
		maxDocs: 8000, maxBytes: 4 << 20}
	for _, done := range []Snapshot{{Xmin: now.Xmax, Xmax: now.Xmax}, {Xmin: late, Xmax: now.Xmax, Xip: []uint64{late}}} {
		plan := explainPage(t, pool, r, position{done: done})
		if n := planBuffers(t, plan); n > 30 {
			t.Errorf("a poll of a destination with 5,000 delivered messages (in progress at done: %v) touched %d buffers:\n%s", done.Xip, n, plan)
		}
	}
}

// currentSnapshot is the server's snapshot now.
func currentSnapshot(t *testing.T, pool *pgxpool.Pool) Snapshot {
	t.Helper()
	var text string
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_snapshot()::text`).Scan(&text); err != nil {
		t.Fatal(err)
	}
	s, err := ParseSnapshot(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// planBuffers is the buffers the whole of an EXPLAIN (ANALYZE, BUFFERS)
// plan touched: its first Buffers line, the top node's.
func planBuffers(t *testing.T, plan string) int {
	t.Helper()
	line := regexp.MustCompile(`Buffers: shared [^\n]*`).FindString(plan)
	if line == "" {
		return 0 // nothing touched
	}
	n := 0
	for _, m := range regexp.MustCompile(`(?:hit|read)=(\d+)`).FindAllStringSubmatch(line, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// A transaction of 100,000 events that committed after the statistics
// were taken is read a page at a time, whether it was in progress at the
// stream's done snapshot or began after it: no plan node handles more rows
// than a page holds, and a page near the transaction's end touches no more
// buffers than a page's share of the table and its index. Two defects made
// one large transaction cost time quadratic in its size: a bitmap scan of
// all of the transaction's remaining rows, sorted for every page (both
// subtests catch it), and, for a transaction in progress at done, an index
// scan that started at the transaction's first row and stepped over all
// rows read before (the first subtest catches it).
func TestLargeTransactionIsReadAPageAtATime(t *testing.T) {
	t.Parallel()
	pool, name := schematest.Setup(t)
	ctx := context.Background()
	id := pgx.Identifier{name}.Sanitize()
	insert := func(ctx context.Context, q interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, n int) {
		t.Helper()
		if _, err := q.Exec(ctx, `INSERT INTO `+id+`.events (index_name, source_id, version, op, document)
			SELECT 'docs', 'doc-' || g, 1, 'upsert', '{}' FROM generate_series(1, $1) g`, n); err != nil {
			t.Fatal(err)
		}
	}
	// As in an outbox whose statistics predate its largest transaction
	// (here: none at all), the planner guesses that transaction's rows.
	if _, err := pool.Exec(ctx, `ALTER TABLE `+id+`.events SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		insert(ctx, pool, 50)
	}
	before := currentSnapshot(t, pool)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	insert(ctx, tx, 100000)
	var xid uint64
	var firstID int64
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint, min(id) FROM `+id+`.events WHERE xid = pg_current_xact_id()`).Scan(&xid, &firstID); err != nil {
		t.Fatal(err)
	}
	// A later transaction's commit moves the snapshot's xmax past the
	// open one, which it then lists as in progress.
	insert(ctx, pool, 1)
	during := currentSnapshot(t, pool)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after := currentSnapshot(t, pool)

	r := &reader{pool: pool, schema: id, maxDocs: 8000, maxBytes: 64 << 20,
		stream: Stream{Name: "docs", BucketHi: 1023, Indexes: []string{"docs"}, Exclude: []string{outbox.MessagePrefix + "*"}}}
	rowsRe := regexp.MustCompile(`actual rows=(\d+)`)
	buffersRe := regexp.MustCompile(`Buffers: shared [^\n]*`)
	countRe := regexp.MustCompile(`(?:hit|read)=(\d+)`)
	// A page's share of the outbox's heap and (xid, id) index pages, twice
	// over: stepping over the transaction's other rows in the index alone
	// costs more.
	var pages, events int
	if err := pool.QueryRow(ctx, `SELECT (pg_relation_size('`+id+`.events') + pg_relation_size('`+id+`.events_xid_id'))
		/ current_setting('block_size')::int, (SELECT count(*) FROM `+id+`.events)`).Scan(&pages, &events); err != nil {
		t.Fatal(err)
	}
	limit := 2*pages*r.maxDocs/events + 20
	// The done snapshots list only this test's transaction as in progress:
	// the server's own also list other tests' transactions, and each costs
	// the late-committer branch an index lookup.
	for _, tc := range []struct {
		name string
		done Snapshot
	}{
		{"in progress at done", Snapshot{Xmin: xid, Xmax: during.Xmax, Xip: []uint64{xid}}},
		{"begun after done", Snapshot{Xmin: before.Xmax, Xmax: before.Xmax}},
	} {
		t.Run("a page of a transaction "+tc.name+" costs a page wherever it starts", func(t *testing.T) {
			for _, at := range []int64{8000, 88000} {
				plan := explainPage(t, pool, r, position{done: tc.done, batch: &after, cursorXID: xid, cursorID: firstID + at})
				for _, m := range rowsRe.FindAllStringSubmatch(plan, -1) {
					if n, _ := strconv.Atoi(m[1]); n > r.maxDocs {
						t.Fatalf("a plan node handled %d rows for a page of %d:\n%s", n, r.maxDocs, plan)
					}
				}
				// The first Buffers line is the top node's: the whole query's.
				line := buffersRe.FindString(plan)
				if line == "" {
					t.Fatalf("no buffer counts in the plan:\n%s", plan)
				}
				touched := 0
				for _, m := range countRe.FindAllStringSubmatch(line, -1) {
					n, _ := strconv.Atoi(m[1])
					touched += n
				}
				if touched > limit {
					t.Fatalf("a page from row %d of the transaction touched %d buffers, more than twice a page's share (%d) of the table and its index:\n%s", at, touched, limit, plan)
				}
			}
		})
	}
	t.Run("a cursor in a transaction that done already covers reads none of it again", func(t *testing.T) {
		r.pos = position{done: after, batch: &after, cursorXID: xid, cursorID: firstID}
		p, err := r.next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.events) != 0 {
			t.Fatalf("read %d events of a transaction visible in done", len(p.events))
		}
	})
	t.Run("the reader reads all of it, a page at a time", func(t *testing.T) {
		r.pos = position{done: during}
		got := 0
		for {
			p, err := r.next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got += len(p.events)
			if r.pos.batch == nil {
				break
			}
			if len(p.events) != r.maxDocs {
				t.Fatalf("a page of %d events before the batch's end, want %d", len(p.events), r.maxDocs)
			}
		}
		if got != 100000 {
			t.Fatalf("read %d events, want the transaction's 100000", got)
		}
	})
}

// explainPage runs the page query from `from` as the reader sends it (in
// a transaction, behind the settings that keep it in index order, as a
// prepared statement with the plan the reader's statement gets, the
// generic one) under EXPLAIN ANALYZE, and returns the plan.
func explainPage(t *testing.T, pool *pgxpool.Pool, r *reader, from position) string {
	t.Helper()
	ctx := context.Background()
	sql, args := r.pageSQL(from, from.batch)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `PREPARE relay_page AS `+sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `DEALLOCATE relay_page`, pgx.QueryExecModeSimpleProtocol)
	literals := make([]string, len(args))
	for i, a := range args {
		literals[i] = sqlLiteral(t, a)
	}
	results := conn.SendBatch(ctx, pageBatch(`EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) EXECUTE relay_page(`+strings.Join(literals, ", ")+`)`, nil))
	defer results.Close()
	for range 2 {
		if _, err := results.Exec(); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := results.Query()
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if err := results.Close(); err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	if !strings.Contains(plan, "$2") {
		t.Fatalf("the page query got a custom plan, not the generic one:\n%s", plan)
	}
	return plan
}

// sqlLiteral writes a page query argument as an untyped SQL literal, which
// takes the type its parameter's cast gives it.
func sqlLiteral(t *testing.T, a any) string {
	t.Helper()
	switch v := a.(type) {
	case []uint64:
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = strconv.FormatUint(x, 10)
		}
		return sqlString("{" + strings.Join(parts, ",") + "}")
	case []string:
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(x) + `"`
		}
		return sqlString("{" + strings.Join(parts, ",") + "}")
	case string:
		return sqlString(v)
	case uint64, int64, int, int16:
		return sqlString(fmt.Sprint(v))
	}
	t.Fatalf("page query argument of type %T", a)
	return ""
}

// pageBatch is a page read within a batch as the reader sends it (without
// a lock check): one read-only transaction, sent as one pipeline.
func pageBatch(sql string, args []any) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(`BEGIN READ ONLY`)
	queuePage(b, sql, args)
	b.Queue(`COMMIT`)
	return b
}

// The reader's page query is planned once per connection (the generic
// plan), and that plan is the index scan a poll needs: over 100,000
// delivered events, a poll that finds 30 new ones touches a few buffers.
// PostgreSQL planned every read anew (0.2-0.4 ms of server CPU, most of
// what a poll cost) and switched to its generic plan on its own when that
// looked cheaper: with the cursor written as id > $3, that plan scanned
// the primary key from the cursor's id and filtered on xid, the whole
// table for a poll.
func TestReadsTakeTheGenericPlan(t *testing.T) {
	t.Parallel()
	other, name := schematest.Setup(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(schematest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // the reader's statements are this connection's
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	id := pgx.Identifier{name}.Sanitize()
	insert := func(n int) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO `+id+`.events (index_name, source_id, version, op, document)
			SELECT 'docs', 'doc-' || g, 1, 'upsert', '{}' FROM generate_series(1, $1) g`, n); err != nil {
			t.Fatal(err)
		}
	}
	insert(100000)
	if _, err := pool.Exec(ctx, `ANALYZE `+id+`.events`); err != nil {
		t.Fatal(err)
	}
	done := currentSnapshot(t, pool)
	r := &reader{pool: pool, schema: id, maxDocs: 4000, maxBytes: 64 << 20,
		stream: Stream{Name: "docs", BucketHi: 1023}, pos: position{done: done}}
	t.Run("a poll over delivered events touches a few buffers", func(t *testing.T) {
		insert(30)
		plan := explainPage(t, pool, r, r.pos)
		if strings.Contains(plan, "events_pkey") || !strings.Contains(plan, "actual rows=30 ") {
			t.Fatalf("a poll's plan does not read the 30 new events by the (xid, id) index:\n%s", plan)
		}
		if touched := planBuffers(t, plan); touched > 30 {
			t.Fatalf("a poll touched %d buffers:\n%s", touched, plan)
		}
	})
	t.Run("a poll beside a large open transaction skips its rows", func(t *testing.T) {
		// An import of 50,000 events still open, in progress in done: the
		// late-committer branch looked its xid up and stepped over every
		// row it had written, on every poll.
		tx, err := other.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO `+id+`.events (index_name, source_id, version, op, document)
			SELECT 'docs', 'open-' || g, 1, 'upsert', '{}' FROM generate_series(1, 50000) g`); err != nil {
			t.Fatal(err)
		}
		insert(1) // moves the snapshot's xmax past the open transaction
		during := currentSnapshot(t, pool)
		if len(during.Xip) == 0 {
			t.Fatal("the open transaction is not in progress in the snapshot")
		}
		plan := explainPage(t, pool, r, position{done: during})
		if touched := planBuffers(t, plan); touched > 30 {
			t.Fatalf("a poll beside an open transaction of 50,000 events touched %d buffers:\n%s", touched, plan)
		}
	})
	t.Run("the reader's page statements are never planned per read", func(t *testing.T) {
		if _, err := r.next(ctx); err != nil { // the events of the first subtest
			t.Fatal(err)
		}
		for range 10 {
			insert(30)
			p, err := r.next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.events) != 30 {
				t.Fatalf("read %d events, want 30", len(p.events))
			}
		}
		var statements, custom int
		if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(custom_plans), 0) FROM pg_prepared_statements
			WHERE statement LIKE '(SELECT id, xid,%'`).Scan(&statements, &custom); err != nil {
			t.Fatal(err)
		}
		if statements == 0 || custom != 0 {
			t.Fatalf("%d page statements, %d custom plans; want every read on the generic plan", statements, custom)
		}
	})
}
