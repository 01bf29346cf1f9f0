package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

func TestRetention(t *testing.T) {
	t.Parallel()

	t.Run("only acknowledged events older than the retention are deleted", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := context.Background()
		sink := newRecordingSink()
		stop := start(t, e.config(sink))
		acked := e.append(t, 30)
		schematest.Eventually(t, 10*time.Second, "acknowledged", func() bool { return sink.has(acked[29]) && e.backlog(t) == 0 })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		pending := e.append(t, 5) // never delivered: no relay runs now
		// Age everything beyond the retention, including the pending events.
		if _, err := e.pool.Exec(ctx, `UPDATE "`+e.schema+`".events SET created_at = now() - interval '8 days'`); err != nil {
			t.Fatal(err)
		}
		n, err := relay.DeleteAcknowledged(ctx, e.pool, e.schema, 7*24*time.Hour, 7)
		if err != nil {
			t.Fatal(err)
		}
		if n != int64(len(acked)) {
			t.Fatalf("deleted %d, want the %d acknowledged events", n, len(acked))
		}
		var left []int64
		rows, err := e.pool.Query(ctx, `SELECT id FROM "`+e.schema+`".events ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id int64
			_ = rows.Scan(&id)
			left = append(left, id)
		}
		if len(left) != len(pending) || left[0] != pending[0] {
			t.Fatalf("left %v, want the unacknowledged %v", left, pending)
		}
	})

	t.Run("a stream that reads past others' events stores that position even when it then idles", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := context.Background()
		// Longer than any gap in the run: without a store on idle, the
		// position stream b read past the events stays unstored.
		e.startStreamsAB(t, 2*time.Second)
		for i := range 3 {
			e.appendTo(t, "a", fmt.Sprint(i))
		}
		var deleted int64
		schematest.Eventually(t, 15*time.Second, "every event deleted by a retention of 0 while the relay idles", func() bool {
			n, err := relay.DeleteAcknowledged(ctx, e.pool, e.schema, 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			deleted += n
			return deleted == 3
		})
	})

	t.Run("the streams of an idle relay do not keep one another storing", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := context.Background()
		// Each store is a transaction that moves every other stream's
		// position past it; at this interval they would store each
		// other's moves several times a second.
		e.startStreamsAB(t, 100*time.Millisecond)
		updated := func() map[string]time.Time {
			t.Helper()
			streams, err := relay.ListStreams(ctx, e.pool, e.schema, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]time.Time{}
			for _, s := range streams {
				out[s.Name] = s.UpdatedAt
			}
			return out
		}
		schematest.Eventually(t, 10*time.Second, "both streams stored a first position", func() bool {
			u := updated()
			return !u["a"].IsZero() && !u["b"].IsZero() && time.Since(u["a"]) > time.Second && time.Since(u["b"]) > time.Second
		})
		before := updated()
		time.Sleep(2 * time.Second)
		if after := updated(); !after["a"].Equal(before["a"]) || !after["b"].Equal(before["b"]) {
			t.Fatalf("an idle relay stored progress again: a %s -> %s, b %s -> %s", before["a"], after["a"], before["b"], after["b"])
		}
	})

	t.Run("events younger than the retention stay for replay", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		stop := start(t, e.config(sink))
		ids := e.append(t, 10)
		schematest.Eventually(t, 10*time.Second, "acknowledged", func() bool { return sink.has(ids[9]) && e.backlog(t) == 0 })
		_ = stop()
		n, err := relay.DeleteAcknowledged(context.Background(), e.pool, e.schema, time.Hour, 100)
		if err != nil || n != 0 {
			t.Fatalf("deleted %d, %v; want 0", n, err)
		}
	})
}

// startStreamsAB starts a relay with streams a and b (of indexes a and b)
// that stores positions moved by empty pages after progressInterval.
func (e *env) startStreamsAB(t *testing.T, progressInterval time.Duration) {
	t.Helper()
	cfg := e.config(newRecordingSink())
	cfg.ProgressInterval = progressInterval
	cfg.Streams = []relay.Stream{
		{Name: "a", BucketHi: 1023, Indexes: []string{"a"}},
		{Name: "b", BucketHi: 1023, Indexes: []string{"b"}},
	}
	start(t, cfg)
}
