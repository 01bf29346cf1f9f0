package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// dlSink rejects events until their source is fixed, like an index whose
// mapping an operator corrects before retrying.
type dlSink struct {
	mu      sync.Mutex
	fixed   map[string]bool
	applied map[string][]int64 // source -> versions applied
}

func (s *dlSink) Write(_ context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	outs := make([]outbox.Outcome, len(events))
	for i, e := range events {
		if !s.fixed[e.SourceID] {
			outs[i] = outbox.Outcome{Status: outbox.Rejected, Reason: "mapper_parsing_exception: field [price]"}
			continue
		}
		s.applied[e.SourceID] = append(s.applied[e.SourceID], e.Version)
		outs[i] = outbox.Outcome{Status: outbox.Applied}
	}
	return outs, nil
}

func (s *dlSink) fix(sources ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, src := range sources {
		s.fixed[src] = true
	}
}

func (s *dlSink) versions(source string) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.applied[source]...)
}

// setupDeadLetters runs a relay whose sink rejects everything until fixed,
// and parks the given events as dead letters.
func setupDeadLetters(t *testing.T, events ...outbox.Event) (*env, *dlSink) {
	t.Helper()
	e, sink := setup(t), &dlSink{fixed: map[string]bool{}, applied: map[string][]int64{}}
	stop := start(t, relay.Config{Pool: e.pool, Schema: e.schema, Sink: sink, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		LeaseInterval: 100 * time.Millisecond})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	for _, ev := range events {
		if _, err := e.outbox.Append(context.Background(), e.pool, ev); err != nil {
			t.Fatal(err)
		}
	}
	schematest.Eventually(t, 20*time.Second, "every event is parked", func() bool { return len(e.list(t, relay.DeadLetterFilter{Limit: 1000})) == len(events) })
	return e, sink
}

func (e *env) list(t *testing.T, f relay.DeadLetterFilter) []relay.DeadLetter {
	t.Helper()
	dls, err := relay.ListDeadLetters(context.Background(), e.pool, e.schema, f)
	if err != nil {
		t.Fatal(err)
	}
	return dls
}

type auditRow struct {
	operator, action string
	ids              []int64
	detail           map[string]any
}

func (e *env) audit(t *testing.T) []auditRow {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT operator, action, ids, detail FROM "`+e.schema+`".audit_log ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []auditRow
	for rows.Next() {
		var a auditRow
		var detail []byte
		if err := rows.Scan(&a.operator, &a.action, &a.ids, &detail); err != nil {
			t.Fatal(err)
		}
		_ = json.Unmarshal(detail, &a.detail)
		out = append(out, a)
	}
	return out
}

func dlUpsert(index, source string, version int64) outbox.Event {
	return outbox.Event{IndexName: index, SourceID: source, Version: version, Op: outbox.OpUpsert,
		Document: json.RawMessage(`{"price":"n/a"}`), Headers: json.RawMessage(`{"trace":"abc"}`), EventType: "product.updated"}
}

func TestDeadLetterList(t *testing.T) {
	t.Parallel()
	e, _ := setupDeadLetters(t, dlUpsert("shop", "a", 1), dlUpsert("shop", "b", 1), dlUpsert("blog", "c", 1), dlUpsert("shop", "d", 2))
	ctx := context.Background()

	t.Run("a dead letter keeps the event and the reason", func(t *testing.T) {
		dls := e.list(t, relay.DeadLetterFilter{SourceID: "d"})
		if len(dls) != 1 {
			t.Fatalf("got %d", len(dls))
		}
		d := dls[0]
		if d.Index != "shop" || d.Version != 2 || d.Op != outbox.OpUpsert || d.Status != relay.DeadLetterParked || d.EventType != "product.updated" ||
			!strings.Contains(d.Reason, "mapper_parsing_exception") || string(d.Headers) != `{"trace": "abc"}` || d.Stream != "default" || d.Kind != relay.KindRejected {
			t.Fatalf("dead letter = %+v (headers %s)", d, d.Headers)
		}
		got, err := relay.GetDeadLetter(ctx, e.pool, e.schema, d.ID)
		if err != nil || got.SourceID != "d" {
			t.Fatalf("get: %+v, %v", got, err)
		}
	})
	t.Run("filters by index, reason and kind, paginated in id order", func(t *testing.T) {
		if n := len(e.list(t, relay.DeadLetterFilter{Index: "shop"})); n != 3 {
			t.Fatalf("index shop: %d", n)
		}
		if n := len(e.list(t, relay.DeadLetterFilter{ReasonContains: "MAPPER_parsing"})); n != 4 {
			t.Fatalf("reason (any case): %d", n)
		}
		if n, m := len(e.list(t, relay.DeadLetterFilter{Kind: relay.KindRejected})), len(e.list(t, relay.DeadLetterFilter{Kind: relay.KindGaveUp})); n != 4 || m != 0 {
			t.Fatalf("kind rejected: %d, gave_up: %d", n, m)
		}
		page1 := e.list(t, relay.DeadLetterFilter{Limit: 2})
		page2 := e.list(t, relay.DeadLetterFilter{Limit: 2, AfterID: page1[1].ID})
		if len(page1) != 2 || len(page2) != 2 || page2[0].ID <= page1[1].ID {
			t.Fatalf("pages: %v then %v", page1, page2)
		}
	})
	t.Run("an unknown id is reported as not found", func(t *testing.T) {
		_, err := relay.GetDeadLetter(ctx, e.pool, e.schema, 999999)
		if !errors.Is(err, relay.ErrDeadLetterNotFound) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("a bad status is refused naming the field", func(t *testing.T) {
		_, err := relay.ListDeadLetters(ctx, e.pool, e.schema, relay.DeadLetterFilter{Status: "lost"})
		if err == nil || !strings.Contains(err.Error(), "status:") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestDeadLetterRetry(t *testing.T) {
	t.Parallel()
	e, sink := setupDeadLetters(t, dlUpsert("shop", "a", 1), dlUpsert("shop", "a", 2), dlUpsert("shop", "b", 1), dlUpsert("blog", "c", 1))
	ctx := context.Background()

	t.Run("retry needs an operator and a selection", func(t *testing.T) {
		if _, err := relay.RetryDeadLetters(ctx, e.pool, e.schema, relay.DeadLetterFilter{Index: "shop"}, ""); err == nil || !strings.Contains(err.Error(), "operator") {
			t.Fatalf("no operator: err = %v", err)
		}
		if _, err := relay.RetryDeadLetters(ctx, e.pool, e.schema, relay.DeadLetterFilter{}, "alice"); err == nil || !strings.Contains(err.Error(), "All") {
			t.Fatalf("no selection: err = %v", err)
		}
	})
	t.Run("a retried dead letter is delivered again by the running relay", func(t *testing.T) {
		sink.fix("a")
		n, err := relay.RetryDeadLetters(ctx, e.pool, e.schema, relay.DeadLetterFilter{Index: "shop", SourceID: "a"}, "alice")
		if err != nil || n != 2 {
			t.Fatalf("retry: %d, %v", n, err)
		}
		schematest.Eventually(t, 20*time.Second, "both versions of a are applied", func() bool { return len(sink.versions("a")) == 2 })
		if v := sink.versions("a"); v[0] != 1 || v[1] != 2 {
			t.Fatalf("versions applied in order %v, want [1 2]", v)
		}
		for _, d := range e.list(t, relay.DeadLetterFilter{SourceID: "a"}) {
			if d.Status != relay.DeadLetterRetried || d.ResolvedBy != "alice" || d.ResolvedAt == nil {
				t.Fatalf("after retry: %+v", d)
			}
		}
		a := e.audit(t)
		if len(a) != 1 || a[0].operator != "alice" || a[0].action != "deadletters.retry" || len(a[0].ids) != 2 || len(a[0].detail["event_ids"].([]any)) != 2 {
			t.Fatalf("audit = %+v", a)
		}
	})
	t.Run("a retried dead letter is not retried twice", func(t *testing.T) {
		n, err := relay.RetryDeadLetters(ctx, e.pool, e.schema, relay.DeadLetterFilter{SourceID: "a"}, "alice")
		if err != nil || n != 0 {
			t.Fatalf("second retry: %d, %v", n, err)
		}
	})
	t.Run("a still-broken event goes back to the dead letters", func(t *testing.T) {
		n, err := relay.RetryDeadLetters(ctx, e.pool, e.schema, relay.DeadLetterFilter{SourceID: "b"}, "bob")
		if err != nil || n != 1 {
			t.Fatalf("retry: %d, %v", n, err)
		}
		schematest.Eventually(t, 20*time.Second, "b is parked again", func() bool {
			return len(e.list(t, relay.DeadLetterFilter{SourceID: "b", Status: relay.DeadLetterParked})) == 1
		})
	})
	t.Run("discard marks the selection and records it", func(t *testing.T) {
		ids := []int64{}
		for _, d := range e.list(t, relay.DeadLetterFilter{Status: relay.DeadLetterParked}) {
			ids = append(ids, d.ID)
		}
		n, err := relay.DiscardDeadLetters(ctx, e.pool, e.schema, relay.DeadLetterFilter{IDs: ids}, "carol")
		if err != nil || n != 2 {
			t.Fatalf("discard: %d, %v", n, err)
		}
		if left := e.list(t, relay.DeadLetterFilter{Status: relay.DeadLetterParked}); len(left) != 0 {
			t.Fatalf("still parked: %+v", left)
		}
		a := e.audit(t)
		last := a[len(a)-1]
		if last.operator != "carol" || last.action != "deadletters.discard" || len(last.ids) != 2 {
			t.Fatalf("audit = %+v", a)
		}
		if sink.versions("c") != nil {
			t.Fatal("a discarded dead letter was delivered")
		}
	})
}
