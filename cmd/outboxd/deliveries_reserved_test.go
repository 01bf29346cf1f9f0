package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// holdSink never answers until its context ends: the stream stays led.
type holdSink struct{}

func (holdSink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A leader that died mid-request leaves its message reserved. While a
// relay leads the destination's stream, that relay finishes it; while none
// does, an operator settles it.
func TestDeliveriesResolveReserved(t *testing.T) {
	e := cliSetup(t)
	ctx := context.Background()
	reserve := func(key string) {
		t.Helper()
		id, err := e.outbox.AppendMessage(ctx, e.pool, outbox.Message{Destination: "d", DedupeKey: key, Payload: json.RawMessage(`{"n":1}`)})
		if err != nil {
			t.Fatal(err)
		}
		// As a sink leaves it when its process dies during the request.
		if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".deliveries (destination, dedupe_key, event_id, payload, state, attempts, in_flight)
			VALUES ('d', $1, $2, '{"n":1}', 'reserved', 1, true)`, key, id); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := deliveries(ctx, append(args[:1:1], append(append([]string{}, e.dbArgs...), args[1:]...)...), &out)
		return out.String(), err
	}

	t.Run("a reserved message of a stream nobody leads is settled by hand", func(t *testing.T) {
		reserve("k1")
		out, err := run("resolve", "k1", "--destination", "d", "--delivered", "--operator", "ops")
		if err != nil || !strings.Contains(out, "state now delivered") {
			t.Fatalf("resolve --delivered of an abandoned reserved row: %q, %v", out, err)
		}
	})

	t.Run("a reserved message is left to the relay that leads its destination's stream", func(t *testing.T) {
		reserve("k2")
		r, err := relay.New(relay.Config{Pool: e.pool, Schema: e.schema, LeaseInterval: 100 * time.Millisecond,
			Streams:    []relay.Stream{{Name: messageStream("d"), BucketHi: 1023, Indexes: []string{outbox.MessagePrefix + "d"}, Sink: holdSink{}}},
			Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		defer func() { cancel(); <-done }()
		schematest.Eventually(t, 15*time.Second, "the relay leads the destination's stream", func() bool { return len(r.Leading()) == 1 })
		if out, err := run("resolve", "k2", "--destination", "d", "--failed", "--operator", "ops"); err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Fatalf("resolve of a reserved row a relay works on: %q, %v; want it refused", out, err)
		}
	})
}
