package relay

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

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
		sql, args := r.pageSQL(r.pos, nil)
		rows, err := pool.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) `+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
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
}
