package tooltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/relay/relaytest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// Source is a source table in a fresh outbox schema, and an index of its
// rows: the fixture of the tests of backfill and rebuild.
type Source struct {
	ES     *elasticsearch.Client
	Name   string // the index name N
	Pool   *pgxpool.Pool
	Schema string
	Table  string // quoted, schema-qualified: id text, version bigint, title text
}

// NewSource creates the table with rows rows, ids a0000001 on, at
// version 1; the index is not created.
func NewSource(t *testing.T, rows int) *Source {
	t.Helper()
	es, name := Index(t, "backfill-")
	pool, schemaName := schematest.Setup(t)
	e := &Source{ES: es, Name: name, Pool: pool, Schema: schemaName, Table: `"` + schemaName + `".articles`}
	for _, q := range []string{
		`CREATE TABLE ` + e.Table + ` (id text PRIMARY KEY, version bigint NOT NULL, title text NOT NULL)`,
		`INSERT INTO ` + e.Table + ` SELECT 'a' || lpad(i::text, 7, '0'), 1, 'title ' || i FROM generate_series(1, ` + fmt.Sprint(rows) + `) i`,
	} {
		if _, err := pool.Exec(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// DocSQL is the document of a row, the same for backfill and live events.
const DocSQL = `json_build_object('id', id, 'version', version, 'title', title)`

// SQL is the source query of the table.
func (e *Source) SQL() string {
	return `SELECT id, version, ` + DocSQL + ` FROM ` + e.Table
}

// AssertProjection compares the index with the table: every row visible
// through the name at its version and title, nothing else visible.
func (e *Source) AssertProjection(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	want := map[string]string{}
	rows, err := e.Pool.Query(ctx, `SELECT id, version, title FROM `+e.Table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, title string
		var v int64
		if err := rows.Scan(&id, &v, &title); err != nil {
			t.Fatal(err)
		}
		want[id] = fmt.Sprintf("%d %s", v, title)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	estest.Refresh(t, e.ES, e.Name)
	got := map[string]string{}
	st, b := estest.Call(t, e.ES, "POST", "/"+e.Name+"/_search?scroll=1m", `{"size":10000,"version":true,"_source":["title"],"sort":["_doc"]}`)
	for {
		var page struct {
			ScrollID string `json:"_scroll_id"`
			Hits     struct {
				Hits []struct {
					ID      string `json:"_id"`
					Version int64  `json:"_version"`
					Source  struct {
						Title string `json:"title"`
					} `json:"_source"`
				} `json:"hits"`
			} `json:"hits"`
		}
		if st != 200 || json.Unmarshal(b, &page) != nil {
			t.Fatalf("scan %s: %d %s", e.Name, st, b)
		}
		if len(page.Hits.Hits) == 0 {
			break
		}
		for _, h := range page.Hits.Hits {
			got[h.ID] = fmt.Sprintf("%d %s", h.Version, h.Source.Title)
		}
		st, b = estest.Call(t, e.ES, "POST", "/_search/scroll", `{"scroll":"1m","scroll_id":"`+page.ScrollID+`"}`)
	}
	var missing, wrong, extra int
	for id, w := range want {
		switch g, ok := got[id]; {
		case !ok:
			missing++
		case g != w:
			wrong++
			if wrong < 5 {
				t.Errorf("%s: index %q, table %q", id, g, w)
			}
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			extra++
		}
	}
	if missing+wrong+extra > 0 {
		t.Fatalf("index vs table (%d rows): %d missing, %d stale, %d resurrected or extra", len(want), missing, wrong, extra)
	}
}

// Writers update and delete random rows of a Source's table, each
// change with its outbox event in one transaction, as an application
// would.
type Writers struct {
	done             chan struct{}
	once             sync.Once
	wg               sync.WaitGroup
	updates, deletes atomic.Int64
}

// StartWriters starts n writers over the table's first rows rows.
func (e *Source) StartWriters(t *testing.T, n, rows int) *Writers {
	t.Helper()
	ctx := context.Background()
	ob, err := outbox.NewOutbox(e.Schema)
	if err != nil {
		t.Fatal(err)
	}
	wr := &Writers{done: make(chan struct{})}
	// Before the schema is dropped (an earlier cleanup, run later): a
	// writer left running would fail on the dropped tables.
	t.Cleanup(wr.Halt)
	for w := range n {
		wr.wg.Add(1)
		go func() {
			defer wr.wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-wr.done:
					return
				default:
				}
				id := fmt.Sprintf("a%07d", 1+rnd.IntN(rows))
				err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
					var v int64
					var doc []byte
					if rnd.IntN(5) == 0 {
						err := tx.QueryRow(ctx, `DELETE FROM `+e.Table+` WHERE id = $1 RETURNING version`, id).Scan(&v)
						if errors.Is(err, pgx.ErrNoRows) {
							return nil
						}
						if err != nil {
							return err
						}
						wr.deletes.Add(1)
						_, err = ob.Append(ctx, tx, outbox.Event{IndexName: e.Name, SourceID: id, Version: v + 1, Op: outbox.OpDelete})
						return err
					}
					err := tx.QueryRow(ctx, `UPDATE `+e.Table+` SET version = version + 1, title = 'edited ' || (version + 1) WHERE id = $1 RETURNING version, `+DocSQL, id).Scan(&v, &doc)
					if errors.Is(err, pgx.ErrNoRows) {
						return nil
					}
					if err != nil {
						return err
					}
					wr.updates.Add(1)
					_, err = ob.Append(ctx, tx, outbox.Event{IndexName: e.Name, SourceID: id, Version: v, Op: outbox.OpUpsert, Document: doc})
					return err
				})
				if err != nil {
					t.Errorf("writer: %v", err)
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	return wr
}

// Halt ends the writers and waits for them; again is a no-op.
func (wr *Writers) Halt() {
	wr.once.Do(func() { close(wr.done) })
	wr.wg.Wait()
}

// Stop ends the writers and fails the test if they changed nothing.
func (wr *Writers) Stop(t *testing.T) (updates, deletes int64) {
	t.Helper()
	wr.Halt()
	if wr.updates.Load() == 0 || wr.deletes.Load() == 0 {
		t.Fatal("the writers changed nothing")
	}
	return wr.updates.Load(), wr.deletes.Load()
}

// StartRelay runs a relay in this process until the returned stop.
func (e *Source) StartRelay(t *testing.T) (stop func()) {
	t.Helper()
	// The streams `outboxd relay` runs (StartRelayProcess): a relay may take
	// over a stream only with the filters it was started with.
	streams, err := relay.Partitions("default", 1)
	if err != nil {
		t.Fatal(err)
	}
	streams[0].Exclude = []string{outbox.MessagePrefix + "*"}
	// Start's cleanup stops it before the schema is dropped, also when
	// the test fails early.
	return relaytest.Start(t, relay.Config{
		Pool: e.Pool, Schema: e.Schema, Sink: NewSink(t, indexer.Options{Client: e.ES}), Streams: streams,
		BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second,
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
}

// StartRelayProcess runs `outboxd relay` as a child process; kill
// SIGKILLs it.
func (e *Source) StartRelayProcess(t *testing.T) (kill func()) {
	t.Helper()
	bin := BuildOutboxd(t)
	logs, err := os.Create(filepath.Join(t.TempDir(), "relay.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := RelayCommand(t, bin, e.Schema, schematest.ElasticsearchURL(t))
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			logs.Close()
		})
	}
	t.Cleanup(kill)
	return kill
}

// WaitBacklog waits until the relay acknowledged every event.
func (e *Source) WaitBacklog(t *testing.T) { waitBacklog(t, e.Pool, e.Schema, false) }

// waitBacklog waits until no stream has a backlog; streams, when true,
// until some stream exists too (a relay just started has none yet).
func waitBacklog(t *testing.T, pool *pgxpool.Pool, schemaName string, streams bool) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := relay.CollectStats(ctx, pool, schemaName)
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog() == 0 && (!streams || len(st.Streams) > 0) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay backlog %d after 2 minutes", st.Backlog())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// BuildOutboxd builds the outboxd binary into the test's temporary
// directory and returns its path: a test that runs it sees the real main
// (logger, error printing, exit codes), not a function called in-process.
func BuildOutboxd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "outboxd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/outboxd/outboxd/cmd/outboxd").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// RelayCommand is `bin relay` on schemaName and the search server at
// esURL, as the tests that run the real process start it: no admin
// server, a short lease, and no scheduled job (the tombstone purge visits
// every index outboxd manages on the server, other tests' too). Nor does it
// upgrade layouts at start: without --indexes a relay upgrades every
// index of the earlier layout on the server, those other packages' tests
// build on purpose included (the indexer's layout test found its old
// layout upgraded before it looked).
func RelayCommand(t *testing.T, bin, schemaName, esURL string) *exec.Cmd {
	t.Helper()
	return exec.Command(bin, "relay", "--database-url", schematest.DatabaseURL(t), "--schema", schemaName,
		"--elasticsearch-url", esURL, "--admin-addr", "", "--lease-interval", "100ms",
		"--retention-schedule", "", "--tombstone-purge-schedule", "", "--upgrade-layouts=false")
}
