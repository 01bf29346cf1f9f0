package relay_test

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// A rolling deploy that adds a stream: relay B has streams s1, s2, s3 and
// starts first, then relay A with s1 and s2 joins. B must not hand s3 over
// to balance the fleet (A cannot lead it); it hands over one of the
// streams both have instead, and every stream keeps a leader.
func TestBalancerHandsAStreamOnlyToARelayThatCanLeadIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	streams := func(names ...string) []relay.Stream {
		var out []relay.Stream
		for _, n := range names {
			out = append(out, relay.Stream{Name: n, BucketHi: 1023})
		}
		return out
	}
	run := func(names ...string) *relay.Relay {
		cfg := e.config(newRecordingSink())
		cfg.Streams = streams(names...)
		r, err := relay.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		})
		return r
	}
	rb := run("s1", "s2", "s3")
	schematest.Eventually(t, 15*time.Second, "B alone leads its three streams", func() bool { return len(rb.Leading()) == 3 })
	ra := run("s1", "s2")
	led := func() int {
		ls, err := relay.Leaders(context.Background(), e.pool, e.schema, []string{"s1", "s2", "s3"})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range ls {
			if l.PID != 0 {
				n++
			}
		}
		return n
	}
	schematest.Eventually(t, 15*time.Second, "A takes one shared stream, B keeps s3, all three are led", func() bool {
		return len(ra.Leading()) == 1 && slices.Contains(rb.Leading(), "s3") && led() == 3
	})
	// Several balance rounds later the split holds.
	time.Sleep(500 * time.Millisecond)
	if len(ra.Leading()) != 1 || len(rb.Leading()) != 2 || !slices.Contains(rb.Leading(), "s3") || led() != 3 {
		t.Fatalf("A leads %v, B leads %v, %d of 3 streams led", ra.Leading(), rb.Leading(), led())
	}
}

// streams drop refuses a stream that a live relay is configured with even
// while nobody leads it (between two leaders, or with its relay hung):
// that relay counts on the stream's progress row to keep what it has not
// handled.
func TestDropStreamRefusesAStreamALiveRelayServes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// A relay that says it can lead s1 and s2 and leads neither (a hung
	// process holding its session), next to a real one with s1 only: s1
	// is led, s2, which only the hung relay serves, is not.
	conn, err := pgx.Connect(ctx, schematest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO "`+e.schema+`".relays (pid, streams) VALUES (pg_backend_pid(), '{s1,s2}')`); err != nil {
		t.Fatal(err)
	}
	h := fnv.New64a()
	h.Write([]byte("outboxd.members\x00" + e.schema))
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared($1)`, int64(h.Sum64())); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(newRecordingSink())
	cfg.Streams = []relay.Stream{{Name: "s1", BucketHi: 1023}}
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { cancel(); <-done }()
	schematest.Eventually(t, 15*time.Second, "the relay leads s1", func() bool { return len(r.Leading()) == 1 })
	for _, s := range []string{"s1", "s2"} {
		if _, err := ensureProgressRow(ctx, e, s); err != nil {
			t.Fatal(err)
		}
	}
	if pid := e.leaderPID(t, "s2"); pid != 0 {
		t.Fatalf("s2 is led by session %d; nobody should lead it", pid)
	}
	last := relay.DropStream(ctx, e.pool, e.schema, "s2", "alice")
	if last == nil {
		t.Fatal("stream s2, which a live relay serves, was dropped")
	}
	if !errors.Is(last, relay.ErrStreamLed) || !strings.Contains(last.Error(), "a live relay is configured with it") {
		t.Fatalf("the drop of s2 was refused for another reason: %v", last)
	}
}

// ensureProgressRow makes sure the stream has a progress row to drop.
func ensureProgressRow(ctx context.Context, e *env, stream string) (int64, error) {
	tag, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".progress (stream, done_snapshot) VALUES ($1, '1:1:') ON CONFLICT DO NOTHING`, stream)
	return tag.RowsAffected(), err
}
