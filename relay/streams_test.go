package relay_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

func (e *env) appendTo(t *testing.T, index, source string) int64 {
	t.Helper()
	id, err := e.outbox.Append(context.Background(), e.pool, outbox.Event{
		IndexName: index, SourceID: source, Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestStreamFilters(t *testing.T) {
	t.Parallel()

	t.Run("streams with their own sinks split the outbox by index name and prefix", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		main, hooks, rest := newRecordingSink(), newRecordingSink(), newRecordingSink()
		cfg := e.config(main)
		cfg.Streams = []relay.Stream{
			{Name: "search", BucketHi: 1023, Exclude: []string{"hook.*"}},
			{Name: "hook-a", BucketHi: 1023, Indexes: []string{"hook.a"}, Sink: hooks},
			{Name: "hook-other", BucketHi: 1023, Indexes: []string{"hook.*"}, Exclude: []string{"hook.a"}, Sink: rest},
		}
		start(t, cfg)
		items := e.appendTo(t, "items", "1")
		// "_" is a LIKE wildcard: a prefix must match it literally.
		underscore := e.appendTo(t, "hook_a", "2")
		a := e.appendTo(t, "hook.a", "3")
		b := e.appendTo(t, "hook.b", "4")
		schematest.Eventually(t, 10*time.Second, "every event reached its stream's sink", func() bool {
			return main.has(items) && main.has(underscore) && hooks.has(a) && rest.has(b)
		})
		time.Sleep(100 * time.Millisecond)
		if main.delivered() != 2 || hooks.delivered() != 1 || rest.delivered() != 1 {
			t.Fatalf("an event reached more than one stream: search %d, hook-a %d, hook-other %d",
				main.delivered(), hooks.delivered(), rest.delivered())
		}
	})

	t.Run("a sink that stalls holds back only its own stream", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		main := newRecordingSink()
		stuck := newRecordingSink()
		stuck.setDown(true)
		cfg := e.config(main)
		cfg.Streams = []relay.Stream{
			{Name: "search", BucketHi: 1023, Exclude: []string{"hook.*"}},
			{Name: "hooks", BucketHi: 1023, Indexes: []string{"hook.*"}, Sink: stuck},
		}
		start(t, cfg)
		e.appendTo(t, "hook.a", "1")
		items := e.appendTo(t, "items", "2")
		schematest.Eventually(t, 10*time.Second, "the search stream delivered past the stuck one", func() bool { return main.has(items) })
	})

	t.Run("a stream may exclude more than before but not less", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		sink := newRecordingSink()
		cfg := e.config(sink)
		cfg.Streams = []relay.Stream{{Name: "s", BucketHi: 1023}}
		stop := start(t, cfg)
		id := e.appendTo(t, "items", "1")
		schematest.Eventually(t, 10*time.Second, "delivered", func() bool { return sink.has(id) })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		cfg.Streams = []relay.Stream{{Name: "s", BucketHi: 1023, Exclude: []string{"hook.*"}}}
		cfg.Registerer = prometheus.NewRegistry()
		stop = start(t, cfg)
		id = e.appendTo(t, "items", "2")
		schematest.Eventually(t, 10*time.Second, "delivered after narrowing", func() bool { return sink.has(id) })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		cfg.Streams = []relay.Stream{{Name: "s", BucketHi: 1023}}
		cfg.Registerer = prometheus.NewRegistry()
		r, err := relay.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = r.Run(ctx)
		if err == nil || !strings.Contains(err.Error(), "stored exclusions") {
			t.Fatalf("want a refusal to widen the stream, got %v", err)
		}
	})

	t.Run("a stream without a sink is refused", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		cfg := e.config(nil)
		cfg.Streams = []relay.Stream{{Name: "x", BucketHi: 1023}}
		if _, err := relay.New(cfg); err == nil || !strings.Contains(err.Error(), `stream "x"`) {
			t.Fatalf("want an error naming the stream, got %v", err)
		}
	})
}
