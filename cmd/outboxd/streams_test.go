package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// runStreamsRelay runs a relay over the given streams until the returned
// stop is called (or the test ends).
func (e *cliEnv) runStreamsRelay(t *testing.T, streams []relay.Stream) (stop func()) {
	t.Helper()
	// Positions moved by empty pages (another partition's events) are
	// stored within 50 ms, not a second or, once quiet, a minute later:
	// the retention subtests wait for them.
	r, err := relay.New(relay.Config{Pool: e.pool, Schema: e.schema, Sink: e.sink, Streams: streams,
		LeaseInterval: 100 * time.Millisecond, ProgressInterval: 50 * time.Millisecond, QuietProgressInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	schematest.Eventually(t, 20*time.Second, "the relay leads its streams", func() bool { return len(r.Leading()) == len(streams) })
	return stop
}

func (e *cliEnv) events(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStreamsAbandonedAfterPartitionsChange(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	ctx := context.Background()
	for i := range 10 {
		e.append(t, "items", "a"+strconv.Itoa(i), `{}`)
	}
	stop := e.runRelay(t) // one stream, "default"
	// Acknowledged, not merely no backlog: before the relay registers its
	// stream there is no progress row, and so no backlog, at all.
	schematest.Eventually(t, 20*time.Second, "the first events are delivered", func() bool {
		var acked int64
		_ = e.pool.QueryRow(ctx, `SELECT coalesce(sum(acked_events), 0) FROM "`+e.schema+`".progress WHERE stream = 'default'`).Scan(&acked)
		return acked == 10 && e.backlog(t) == 0
	})
	stop()

	// The operator moves to two partitions: "default" is left behind.
	two, err := relay.Partitions("default", 2)
	if err != nil {
		t.Fatal(err)
	}
	e.runStreamsRelay(t, two)
	for i := range 20 {
		e.append(t, "items", "b"+strconv.Itoa(i), `{}`)
	}
	// New streams start from the oldest retained event: 10 + 20.
	schematest.Eventually(t, 20*time.Second, "the partitions deliver every event", func() bool {
		var acked int64
		_ = e.pool.QueryRow(ctx, `SELECT coalesce(sum(acked_events), 0) FROM "`+e.schema+`".progress WHERE stream <> 'default'`).Scan(&acked)
		return acked == 30
	})
	// Retention deletes an event once every stream's stored done snapshot
	// sees it. A partition that last read an event of its own before the
	// other's last event stores the position that sees it (moved by empty
	// pages) only ProgressInterval later: wait for that, not for time.
	schematest.Eventually(t, 20*time.Second, "the partitions' stored positions see every event", func() bool {
		left := -1
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".events e WHERE EXISTS (
			SELECT 1 FROM "`+e.schema+`".progress p WHERE p.stream <> 'default' AND NOT pg_visible_in_snapshot(e.xid, p.done_snapshot))`).Scan(&left)
		return left == 0
	})
	time.Sleep(400 * time.Millisecond) // longer than --abandoned-after below

	t.Run("list marks the left-behind stream abandoned and the led ones not", func(t *testing.T) {
		var out bytes.Buffer
		if err := streams(ctx, append([]string{"list", "--json", "--abandoned-after", "300ms"}, e.dbArgs...), &out); err != nil {
			t.Fatal(err)
		}
		var list []relay.StreamInfo
		if err := json.Unmarshal(out.Bytes(), &list); err != nil {
			t.Fatalf("%v in %s", err, out.String())
		}
		got := map[string]relay.StreamInfo{}
		for _, s := range list {
			got[s.Name] = s
		}
		if s := got["default"]; !s.Abandoned || s.LeaderPID != 0 || s.Position == "" || s.UpdatedAt.IsZero() {
			t.Fatalf("default = %+v, want abandoned, no leader, a position and a progress time", s)
		}
		for _, p := range two {
			if s := got[p.Name]; s.Abandoned || s.LeaderPID == 0 {
				t.Fatalf("%s = %+v, want led and not abandoned", p.Name, s)
			}
		}
		out.Reset()
		if err := streams(ctx, append([]string{"list", "--abandoned-after", "300ms"}, e.dbArgs...), &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "ABANDONED") || !strings.Contains(out.String(), "streams drop") {
			t.Fatalf("the table does not flag the abandoned stream:\n%s", out.String())
		}
	})

	t.Run("status shows the abandoned stream", func(t *testing.T) {
		var out bytes.Buffer
		err := status(ctx, append([]string{"--abandoned-after", "300ms", "--max-age", "0"}, e.dbArgs...), &out)
		if err != nil || !strings.Contains(out.String(), "NONE (ABANDONED)") || !strings.Contains(out.String(), "abandoned streams hold retention back: default") {
			t.Fatalf("status: %v\n%s", err, out.String())
		}
	})

	t.Run("retention keeps what the abandoned stream never acknowledged", func(t *testing.T) {
		if _, err := relay.DeleteAcknowledged(ctx, e.pool, e.schema, 0, 100); err != nil {
			t.Fatal(err)
		}
		if n := e.events(t); n != 20 {
			t.Fatalf("%d events retained, want the 20 written after the change", n)
		}
	})

	t.Run("drop refuses a stream a relay leads", func(t *testing.T) {
		var out bytes.Buffer
		err := streams(ctx, append([]string{"drop", two[0].Name, "--operator", "alice"}, e.dbArgs...), &out)
		if !errors.Is(err, relay.ErrStreamLed) || !strings.Contains(err.Error(), "backend pid") {
			t.Fatalf("err = %v, want a refusal naming the leader", err)
		}
		var rows int
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".progress WHERE stream = $1`, two[0].Name).Scan(&rows)
		if rows != 1 {
			t.Fatalf("the led stream's progress row is gone")
		}
	})

	t.Run("drop of an unknown stream says so", func(t *testing.T) {
		err := streams(ctx, append([]string{"drop", "nope", "--operator", "alice"}, e.dbArgs...), io.Discard)
		if !errors.Is(err, relay.ErrStreamNotFound) {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("after drop retention deletes the old events and the audit log names the operator", func(t *testing.T) {
		var out bytes.Buffer
		if err := streams(ctx, append([]string{"drop", "default", "--operator", "alice"}, e.dbArgs...), &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "dropped stream default as alice") {
			t.Fatalf("output: %s", out.String())
		}
		deleted, err := relay.DeleteAcknowledged(ctx, e.pool, e.schema, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if n := e.events(t); deleted != 20 || n != 0 {
			t.Fatalf("retention deleted %d, %d events left; want all 20 gone", deleted, n)
		}
		var operator, stream string
		err = e.pool.QueryRow(ctx, `SELECT operator, detail->>'name' FROM "`+e.schema+`".audit_log WHERE action = 'streams.drop'`).Scan(&operator, &stream)
		if err != nil || operator != "alice" || stream != "default" {
			t.Fatalf("audit_log: %q %q %v", operator, stream, err)
		}
	})
}

func TestStreamsBadInput(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"drop", "--operator", "alice"}, "name: drop needs the stream's name"},
		{[]string{"list", "--abandoned-after", "0s"}, "abandoned-after: must be > 0"},
		{[]string{"list", "extra"}, `unexpected argument "extra"`},
		{[]string{"rename"}, `unknown action "rename"`},
	} {
		err := streams(context.Background(), c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("streams %v: err = %v, want %q", c.args, err, c.want)
		}
	}
}
