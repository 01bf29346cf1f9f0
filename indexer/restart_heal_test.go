//go:build restart

package indexer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// flow is a relay with the real sink and a writer appending events while a
// server goes away and comes back.
type flow struct {
	es     *elasticsearch.Client
	name   string
	pool   *pgxpool.Pool
	schema string
	relay  *relay.Relay

	mu       sync.Mutex
	versions map[string]int64 // highest committed version per source
	stopped  chan struct{}
}

const flowSources = 100

func startFlow(t *testing.T) *flow {
	t.Helper()
	es, name := setup(t)
	pool, schemaName := schematest.Setup(t)
	f := &flow{es: es, name: name, pool: pool, schema: schemaName, versions: map[string]int64{}, stopped: make(chan struct{})}
	// The production defaults, BackoffMax 30 s included: recovery must not
	// wait out a backoff grown over the outage.
	r, err := relay.New(relay.Config{
		Pool: pool, Schema: schemaName, Sink: newSink(t, Options{Client: es}),
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	f.relay = r
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	go func() {
		select {
		case err := <-runErr:
			runErr <- err
			t.Errorf("the relay exited: %v", err)
		case <-ctx.Done():
		}
	}()
	f.write(t)
	return f
}

// write appends one event every few milliseconds until stop, retrying
// through outages; an append whose outcome is unknown is simply sent again
// at the same version, which the index treats as a duplicate.
func (f *flow) write(t *testing.T) {
	ob, err := outbox.NewOutbox(f.schema)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { f.stop(); <-done })
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			src := fmt.Sprintf("s%03d", i%flowSources)
			f.mu.Lock()
			v := f.versions[src] + 1
			f.mu.Unlock()
			for {
				select {
				case <-f.stopped:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := ob.Append(ctx, f.pool, outbox.Event{IndexName: f.name, SourceID: src, Version: v, Op: outbox.OpUpsert, Document: json.RawMessage(docN(v))})
				cancel()
				if err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			f.mu.Lock()
			f.versions[src] = v
			f.mu.Unlock()
			time.Sleep(3 * time.Millisecond)
		}
	}()
}

func (f *flow) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.stopped:
	default:
		close(f.stopped)
	}
}

// acked is the number of acknowledged events, -1 while PostgreSQL does not answer.
func (f *flow) acked() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := relay.CollectStats(ctx, f.pool, f.schema)
	if err != nil || len(st.Streams) != 1 {
		return -1
	}
	return st.Streams[0].Acknowledged
}

// flowing waits until events are being acknowledged (a freshly restarted
// node may take a while to create the index).
func (f *flow) flowing(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); f.acked() <= 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("nothing acknowledged within two minutes")
		}
	}
	time.Sleep(time.Second)
}

// resumed waits until acknowledgements advance past what they were at
// since, and returns how long after since that happened.
func (f *flow) resumed(t *testing.T, since time.Time) time.Duration {
	t.Helper()
	base := int64(-1)
	for base < 0 {
		base = f.acked()
	}
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n := f.acked(); n > base {
			return time.Since(since)
		}
	}
	t.Fatal("delivery did not resume within two minutes")
	return 0
}

// converged stops the writer, waits for the backlog to drain and checks
// that every source's document in the index is its last committed version.
func (f *flow) converged(t *testing.T) {
	t.Helper()
	f.stop()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := relay.CollectStats(ctx, f.pool, f.schema)
		if err == nil && st.Backlog() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backlog not drained within two minutes (%v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The database's own view: the last version of each source in the outbox.
	rows, err := f.pool.Query(ctx, `SELECT source_id, max(version) FROM "`+f.schema+`".events GROUP BY source_id`)
	if err != nil {
		t.Fatal(err)
	}
	want, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]any, error) {
		var s string
		var v int64
		err := r.Scan(&s, &v)
		return [2]any{s, v}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != flowSources {
		t.Fatalf("the outbox has %d sources, want %d", len(want), flowSources)
	}
	for _, w := range want {
		src, v := w[0].(string), w[1].(int64)
		d := getDoc(t, f.es, f.name, src)
		var got, exp any
		_ = json.Unmarshal(d.Source, &got)
		_ = json.Unmarshal([]byte(docN(v)), &exp)
		if d.Version != v || !reflect.DeepEqual(got, exp) {
			t.Fatalf("%s: index has version %d %s, the database %d", src, d.Version, d.Source, v)
		}
	}
}

// watchBack polls probe from now on and reports when it first succeeded
// after having failed.
func watchBack(t *testing.T, probe func(context.Context) error) (back func() time.Time) {
	var mu sync.Mutex
	var at time.Time
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		down := false
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := probe(ctx)
			cancel()
			if err != nil {
				down = true
			} else if down {
				mu.Lock()
				at = time.Now()
				mu.Unlock()
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() time.Time {
		for {
			mu.Lock()
			a := at
			mu.Unlock()
			if !a.IsZero() {
				return a
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func TestRestartPostgresWhileEventsFlow(t *testing.T) {
	f := startFlow(t)

	t.Run("the relay recovers by itself within 5 s of PostgreSQL answering and the index equals the database", func(t *testing.T) {
		f.flowing(t)
		cc := f.pool.Config().ConnConfig
		back := watchBack(t, func(ctx context.Context) error {
			conn, err := pgx.ConnectConfig(ctx, cc)
			if err != nil {
				return err
			}
			return conn.Close(ctx)
		})
		services(t, "restart-pg")
		up := back()
		took := f.resumed(t, up)
		t.Logf("delivery resumed %s after PostgreSQL answered again", took.Round(time.Millisecond))
		if took > 5*time.Second {
			t.Fatalf("delivery resumed %s after PostgreSQL answered, want within 5s", took)
		}
		if len(f.relay.Leading()) != 1 {
			t.Fatal("the relay does not lead its stream after recovering")
		}
		time.Sleep(time.Second) // more events after the restart
		f.converged(t)
	})
}

func TestRestartElasticsearchOutage(t *testing.T) {
	f := startFlow(t)

	t.Run("after a 20 s outage the backlog starts draining within 2 s of the cluster answering", func(t *testing.T) {
		f.flowing(t)
		back := watchBack(t, func(ctx context.Context) error { return probeHealthy(ctx, f.es) })
		stopped := time.Now()
		services(t, "stop-es")
		time.Sleep(20*time.Second - time.Since(stopped))
		services(t, "start-es")
		up := back()
		t.Logf("Elasticsearch answered, healthy, %s after it was stopped", up.Sub(stopped).Round(time.Second))
		took := f.resumed(t, up)
		t.Logf("delivery resumed %s after Elasticsearch answered again", took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Fatalf("delivery resumed %s after the cluster answered, want within 2s", took)
		}
		time.Sleep(time.Second)
		f.converged(t)
	})
}
