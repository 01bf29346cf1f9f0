package backfill

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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// backfillEnv is a source table in a fresh outbox schema and an index.
type backfillEnv struct {
	es     *elasticsearch.Client
	name   string
	pool   *pgxpool.Pool
	schema string
	table  string
}

func setupBackfill(t *testing.T, rows int) *backfillEnv {
	t.Helper()
	es, name := backfillIndex(t)
	pool, schemaName := schematest.Setup(t)
	e := &backfillEnv{es: es, name: name, pool: pool, schema: schemaName, table: `"` + schemaName + `".articles`}
	for _, q := range []string{
		`CREATE TABLE ` + e.table + ` (id text PRIMARY KEY, version bigint NOT NULL, title text NOT NULL)`,
		`INSERT INTO ` + e.table + ` SELECT 'a' || lpad(i::text, 7, '0'), 1, 'title ' || i FROM generate_series(1, ` + fmt.Sprint(rows) + `) i`,
	} {
		if _, err := pool.Exec(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func backfillIndex(t *testing.T) (*elasticsearch.Client, string) {
	t.Helper()
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{schematest.ElasticsearchURL(t)}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	name := schematest.Name("backfill-")
	t.Cleanup(func() {
		res, err := esapi.IndicesDeleteRequest{Index: []string{name + "-0*"}}.Do(context.Background(), es)
		if err == nil {
			res.Body.Close()
		}
	})
	return es, name
}

// docSQL is the document of a row, the same for backfill and live events.
const docSQL = `json_build_object('id', id, 'version', version, 'title', title)`

func (e *backfillEnv) sourceSQL() string {
	return `SELECT id, version, ` + docSQL + ` FROM ` + e.table
}

func (e *backfillEnv) opts(sink *indexer.Sink) Options {
	return Options{Pool: e.pool, Schema: e.schema, Sink: sink, Index: e.name, SourceSQL: e.sourceSQL(), Batch: 2000}
}

// assertProjection compares the index with the table: every row visible
// through the name at its version and title, nothing else visible.
func (e *backfillEnv) assertProjection(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	want := map[string]string{}
	rows, err := e.pool.Query(ctx, `SELECT id, version, title FROM `+e.table)
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
	refresh(t, e.es, e.name)
	got := map[string]string{}
	st, b := esCall(t, e.es, "POST", "/"+e.name+"/_search?scroll=1m", `{"size":10000,"version":true,"_source":["title"],"sort":["_doc"]}`)
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
			t.Fatalf("scan %s: %d %s", e.name, st, b)
		}
		if len(page.Hits.Hits) == 0 {
			break
		}
		for _, h := range page.Hits.Hits {
			got[h.ID] = fmt.Sprintf("%d %s", h.Version, h.Source.Title)
		}
		st, b = esCall(t, e.es, "POST", "/_search/scroll", `{"scroll":"1m","scroll_id":"`+page.ScrollID+`"}`)
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

// writers update and delete random rows of a backfillEnv's table, each
// change with its outbox event in one transaction, as an application
// would.
type writers struct {
	done             chan struct{}
	once             sync.Once
	wg               sync.WaitGroup
	updates, deletes atomic.Int64
}

func (e *backfillEnv) startWriters(t *testing.T, n, rows int) *writers {
	t.Helper()
	ctx := context.Background()
	ob, err := outbox.NewOutbox(e.schema)
	if err != nil {
		t.Fatal(err)
	}
	wr := &writers{done: make(chan struct{})}
	// Before the schema is dropped (an earlier cleanup, run later): a
	// writer left running would fail on the dropped tables.
	t.Cleanup(wr.halt)
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
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					var v int64
					var doc []byte
					if rnd.IntN(5) == 0 {
						err := tx.QueryRow(ctx, `DELETE FROM `+e.table+` WHERE id = $1 RETURNING version`, id).Scan(&v)
						if errors.Is(err, pgx.ErrNoRows) {
							return nil
						}
						if err != nil {
							return err
						}
						wr.deletes.Add(1)
						_, err = ob.Append(ctx, tx, outbox.Event{IndexName: e.name, SourceID: id, Version: v + 1, Op: outbox.OpDelete})
						return err
					}
					err := tx.QueryRow(ctx, `UPDATE `+e.table+` SET version = version + 1, title = 'edited ' || (version + 1) WHERE id = $1 RETURNING version, `+docSQL, id).Scan(&v, &doc)
					if errors.Is(err, pgx.ErrNoRows) {
						return nil
					}
					if err != nil {
						return err
					}
					wr.updates.Add(1)
					_, err = ob.Append(ctx, tx, outbox.Event{IndexName: e.name, SourceID: id, Version: v, Op: outbox.OpUpsert, Document: doc})
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

// halt ends the writers and waits for them; again is a no-op.
func (wr *writers) halt() {
	wr.once.Do(func() { close(wr.done) })
	wr.wg.Wait()
}

// stop ends the writers and fails the test if they changed nothing.
func (wr *writers) stop(t *testing.T) (updates, deletes int64) {
	t.Helper()
	wr.halt()
	if wr.updates.Load() == 0 || wr.deletes.Load() == 0 {
		t.Fatal("the writers changed nothing")
	}
	return wr.updates.Load(), wr.deletes.Load()
}

// startRelay runs a relay in this process until the returned stop.
func (e *backfillEnv) startRelay(t *testing.T) (stop func()) {
	t.Helper()
	// The streams `outboxd relay` runs (startRelayProcess): a relay may take
	// over a stream only with the filters it was started with.
	streams, err := relay.Partitions("default", 1)
	if err != nil {
		t.Fatal(err)
	}
	streams[0].Exclude = []string{outbox.MessagePrefix + "*"}
	r, err := relay.New(relay.Config{
		Pool: e.pool, Schema: e.schema, Sink: newSink(t, indexer.Options{Client: e.es}), Streams: streams,
		BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second,
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		})
	}
	t.Cleanup(stop) // before the schema is dropped, also when the test fails early
	return stop
}

// startRelayProcess runs `outboxd relay` as a child process; kill
// SIGKILLs it.
func (e *backfillEnv) startRelayProcess(t *testing.T) (kill func()) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "outboxd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/outboxd/outboxd/cmd/outboxd").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	logs, err := os.Create(filepath.Join(dir, "relay.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "relay", "--database-url", schematest.DatabaseURL(t), "--schema", e.schema,
		"--elasticsearch-url", schematest.ElasticsearchURL(t), "--admin-addr", "", "--lease-interval", "100ms",
		"--retention-schedule", "", "--tombstone-purge-schedule", "")
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

// waitBacklog waits until the relay acknowledged every event.
func (e *backfillEnv) waitBacklog(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := relay.CollectStats(ctx, e.pool, e.schema)
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay backlog %d after 2 minutes", st.Backlog())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a backfill interrupted midway and run again, with writers updating and deleting and the relay delivering, ends equal to the table", func(t *testing.T) {
		t.Parallel()
		const rows = 100_000
		e := setupBackfill(t, rows)
		stopRelay := e.startRelay(t)
		wr := e.startWriters(t, 4, rows)

		// First run: cancelled from inside, right after its 15th batch is
		// stored.
		sink := newSink(t, indexer.Options{Client: e.es})
		bctx, cancel := context.WithCancel(ctx)
		o := e.opts(sink)
		o.afterStore = func(batches int) {
			if batches == 15 {
				cancel()
			}
		}
		first, err := Run(bctx, o)
		cancel()
		if !errors.Is(err, context.Canceled) || first.Rows != 15*2000 {
			t.Fatalf("first run: %+v, %v; want it cancelled after 15 batches of 2000 rows", first, err)
		}
		second, err := Run(ctx, e.opts(sink))
		if err != nil {
			t.Fatal(err)
		}
		if second.From == "" || second.Rows >= rows-first.Rows+int64(4*2000) {
			t.Fatalf("second run did not continue after the stored key: first %+v, second %+v", first, second)
		}
		updates, deletes := wr.stop(t)
		t.Logf("backfill: first run %d rows, second %d rows after %q (%d applied, %d stale); writers: %d updates, %d deletes",
			first.Rows, second.Rows, second.From, second.Applied, second.Stale, updates, deletes)
		e.waitBacklog(t)
		stopRelay()
		e.assertProjection(t)
	})

	t.Run("a row older than the index holds is stale, a deleted document stays deleted, a bad row is reported and the rest arrive", func(t *testing.T) {
		t.Parallel()
		e := setupBackfill(t, 3) // a0000001..a0000003 at version 1
		sink := newSink(t, indexer.Options{Client: e.es})
		mustWrite(t, sink, upsert(e.name, "a0000001", 5, `{"title":"newer"}`), del(e.name, "a0000002", 3))
		if _, err := e.pool.Exec(ctx, `INSERT INTO `+e.table+` VALUES ('bad', 1, 'x')`); err != nil {
			t.Fatal(err)
		}
		o := e.opts(sink)
		o.SourceSQL = `SELECT id, version, CASE WHEN id = 'bad' THEN '[1]'::json ELSE ` + docSQL + ` END FROM ` + e.table
		rep, err := Run(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Rows != 4 || rep.Applied != 1 || rep.Stale != 2 || rep.Rejected != 1 || len(rep.Samples) != 1 ||
			rep.Samples[0].ID != "bad" || !strings.Contains(rep.Samples[0].Reason, "document") {
			t.Fatalf("report %+v", rep)
		}
		docs := searchRead(t, e.es, e.name)
		if len(docs) != 2 || !strings.Contains(string(docs["a0000001"]), "newer") || docs["a0000003"] == nil {
			t.Fatalf("visible: %v", docs)
		}
	})

	t.Run("an unfinished backfill is continued only with the same query; restart starts over", func(t *testing.T) {
		t.Parallel()
		e := setupBackfill(t, 10)
		if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".backfills (index_name, source_hash, last_key) VALUES ($1, 'other', 'a0000005')`, e.name); err != nil {
			t.Fatal(err)
		}
		o := e.opts(newSink(t, indexer.Options{Client: e.es}))
		if _, err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "another source_sql") {
			t.Fatalf("got %v", err)
		}
		o.Restart = true
		rep, err := Run(ctx, o)
		if err != nil || rep.Rows != 10 || rep.From != "" {
			t.Fatalf("restart: %+v, %v", rep, err)
		}
		o.Restart = false
		rep, err = Run(ctx, o) // finished: a new run starts from the beginning
		if err != nil || rep.Rows != 10 || rep.Stale != 10 {
			t.Fatalf("again: %+v, %v", rep, err)
		}
	})

	t.Run("a query that tries to write is refused by the read-only transaction", func(t *testing.T) {
		t.Parallel()
		e := setupBackfill(t, 2)
		o := e.opts(newSink(t, indexer.Options{Client: e.es}))
		wipe := `"` + e.schema + `".wipe()`
		if _, err := e.pool.Exec(ctx, `CREATE FUNCTION `+wipe+` RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN DELETE FROM `+e.table+`; RETURN 1; END $$`); err != nil {
			t.Fatal(err)
		}
		o.SourceSQL = `SELECT id, version, ` + docSQL + ` FROM ` + e.table + `, (SELECT ` + wipe + `) w`
		if _, err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "read-only") {
			t.Fatalf("got %v", err)
		}
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table).Scan(&n); err != nil || n != 2 {
			t.Fatalf("rows left: %d, %v", n, err)
		}
	})
}
