//go:build cluster

// The distributed setups: a 3-node Elasticsearch cluster, a PostgreSQL
// primary with a streaming standby, and several relay processes. They kill
// servers, so they run on their own (make test-cluster), against the
// servers scripts/services starts with OUTBOXD_ES_NODES=3 and
// OUTBOXD_PG_STANDBY=1, never against shared ones.

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

var (
	clusterBinOnce sync.Once
	clusterBin     string
	clusterBinErr  error
)

// outboxdBinary builds the command once for all cluster tests.
func outboxdBinary(t *testing.T) string {
	t.Helper()
	clusterBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "outboxd-cluster-")
		if err != nil {
			clusterBinErr = err
			return
		}
		clusterBin = filepath.Join(dir, "outboxd")
		if out, err := exec.Command("go", "build", "-o", clusterBin, ".").CombinedOutput(); err != nil {
			clusterBinErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if clusterBinErr != nil {
		t.Fatal(clusterBinErr)
	}
	return clusterBin
}

// services runs scripts/services with the test's environment (the
// OUTBOXD_* knobs make test-cluster set).
func services(t *testing.T, args ...string) {
	t.Helper()
	c := exec.Command("../../scripts/services", args...)
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	start := time.Now()
	if err := c.Run(); err != nil {
		t.Fatalf("scripts/services %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("scripts/services %s took %s", strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond))
}

type clusterEnv struct {
	pool   *pgxpool.Pool
	schema string
	dbURL  string
	esURLs []string
	index  string
	spec   string
	ob     *outbox.Outbox
}

func newClusterEnv(t *testing.T) *clusterEnv {
	t.Helper()
	urls := indexer.SplitAddresses(os.Getenv("ELASTICSEARCH_URL"))
	if len(urls) < 3 {
		t.Fatalf("ELASTICSEARCH_URL lists %d node(s); these tests need the 3-node cluster of make test-cluster", len(urls))
	}
	pool, name := schematest.Setup(t)
	ob, err := outbox.NewOutbox(name)
	if err != nil {
		t.Fatal(err)
	}
	e := &clusterEnv{pool: pool, schema: name, dbURL: schematest.DatabaseURL(t), esURLs: urls, index: schematest.Name("cl-"), ob: ob}
	e.spec = filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(e.spec, []byte(`{"settings":{"number_of_shards":1,"number_of_replicas":1}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.esAny(t, "DELETE", "/"+e.index+"-*?ignore_unavailable=true", "") })
	return e
}

// esAny sends one request to the first node that answers.
func (e *clusterEnv) esAny(t *testing.T, method, path, body string) []byte {
	t.Helper()
	var last error
	for _, u := range e.esURLs {
		req, _ := http.NewRequest(method, u+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		c := http.Client{Timeout: 60 * time.Second}
		resp, err := c.Do(req)
		if err != nil {
			last = err
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 300 && resp.StatusCode != 404 {
			last = fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
			continue
		}
		return b
	}
	t.Fatalf("no node answered %s %s: %v", method, path, last)
	return nil
}

// esAnyQuiet is esAny for background goroutines: nil instead of failing.
func (e *clusterEnv) esAnyQuiet(method, path, body string) []byte {
	for _, u := range e.esURLs {
		req, _ := http.NewRequest(method, u+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		c := http.Client{Timeout: 10 * time.Second}
		resp, err := c.Do(req)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 300 {
			return b
		}
	}
	return nil
}

// nodeOf returns the number N of node outboxd-node-N holding the index's
// primary shard ("primary") or elected as master ("master").
func (e *clusterEnv) nodeOf(t *testing.T, what string) int {
	t.Helper()
	var name string
	if what == "master" {
		name = strings.TrimSpace(string(e.esAny(t, "GET", "/_cat/master?h=node", "")))
	} else {
		var shards []struct{ Prirep, Node string }
		if err := json.Unmarshal(e.esAny(t, "GET", "/_cat/shards/"+e.index+"-*?format=json&h=prirep,node", ""), &shards); err != nil {
			t.Fatal(err)
		}
		for _, s := range shards {
			if s.Prirep == "p" {
				name = s.Node
			}
		}
	}
	n, err := strconv.Atoi(strings.TrimPrefix(name, "outboxd-node-"))
	if err != nil {
		t.Fatalf("%s node %q is not one of scripts/services' nodes", what, name)
	}
	return n
}

// relayProc is one `outboxd relay` process, as on its own host.
type relayProc struct {
	cmd   *exec.Cmd
	admin string
	done  chan struct{}
}

func (e *clusterEnv) startRelay(t *testing.T, dbURL string, extra ...string) *relayProc {
	t.Helper()
	admin := freeAddr(t)
	args := append([]string{"relay", "--database-url", dbURL, "--schema", e.schema,
		"--elasticsearch-url", strings.Join(e.esURLs, ","), "--index-spec", e.spec,
		"--admin-addr", admin, "--lease-interval", "1s", "--backoff-max", "2s",
		"--retention-schedule", "", "--tombstone-purge-schedule", ""}, extra...)
	cmd := exec.Command(outboxdBinary(t), args...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "relay.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &relayProc{cmd: cmd, admin: admin, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("relay %s log (tail):\n%s", admin, tail(string(b), 10000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (p *relayProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *relayProc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// metrics returns the relay's samples of one metric, keyed by labels.
func (p *relayProc) metrics(name string) map[string]float64 {
	out := map[string]float64{}
	// /metrics may wait for the backlog query (up to 5 s on a loaded
	// machine); a scrape cut short reads as zeros.
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[len(name):i]] = v
		}
	}
	return out
}

func (p *relayProc) sum(name string) float64 {
	var s float64
	for _, v := range p.metrics(name) {
		s += v
	}
	return s
}

// leads lists the streams this relay leads, by its outboxd_leader gauge.
// leads counts the search streams the relay leads: every relay also has
// the webhook-unrouted stream, which says nothing about the partitions.
func (p *relayProc) leads() int { return p.leading(false) }

// leading counts the streams the relay leads, webhook-unrouted included
// when all is set.
func (p *relayProc) leading(all bool) int {
	n := 0
	for k, v := range p.metrics("outboxd_leader") {
		if !all && strings.Contains(k, `"webhook-unrouted"`) {
			continue
		}
		if v == 1 {
			n++
		}
	}
	return n
}

func (p *relayProc) ready() bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// writers appends events from n goroutines, in transactions of 100,
// upserting (9 in 10) and deleting source ids drawn from keyspace, until
// total events are written or ctx ends. A failed transaction is retried,
// as an application would after a lost connection.
type writers struct {
	written atomic.Int64
	wg      sync.WaitGroup
}

func (e *clusterEnv) write(ctx context.Context, pool *pgxpool.Pool, n, total, keyspace int, prefix string, pause time.Duration) *writers {
	w := &writers{}
	for i := 0; i < n; i++ {
		w.wg.Add(1)
		go func(i int) {
			defer w.wg.Done()
			rng := rand.New(rand.NewSource(int64(i) + time.Now().UnixNano()))
			for k := 0; k < total/n && ctx.Err() == nil; k += 100 {
				batch := make([]outbox.Event, 100)
				for j := range batch {
					sid := prefix + strconv.Itoa(rng.Intn(keyspace))
					batch[j] = outbox.Event{IndexName: e.index, SourceID: sid, Op: outbox.OpUpsert,
						Document: json.RawMessage(fmt.Sprintf(`{"writer":%d,"n":%d}`, i, k+j))}
					if rng.Intn(10) == 0 {
						batch[j] = outbox.Event{IndexName: e.index, SourceID: sid, Op: outbox.OpDelete}
					}
				}
				// One lock order for the versions rows across writers, or
				// concurrent batches deadlock on shared source ids.
				sort.SliceStable(batch, func(a, b int) bool { return batch[a].SourceID < batch[b].SourceID })
				for ctx.Err() == nil {
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						_, err := e.ob.AppendBatch(ctx, tx, batch)
						return err
					})
					if err == nil {
						w.written.Add(int64(len(batch)))
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				time.Sleep(pause)
			}
		}(i)
	}
	return w
}

// verdict compares the search name with the max-version projection of the
// outbox: each source's highest-version event decides whether it must be
// visible, and at which version.
type verdict struct {
	Missing, Stale, Ahead, Resurrected, Extra, DeadLetters int
	Sources, Visible                                       int
}

func (v verdict) clean() bool {
	return v.Missing+v.Stale+v.Ahead+v.Resurrected+v.Extra+v.DeadLetters == 0
}

func (e *clusterEnv) compare(t *testing.T, pool *pgxpool.Pool) verdict {
	t.Helper()
	ctx := context.Background()
	e.esAny(t, "POST", "/"+e.index+"/_refresh", "")
	visible := map[string]int64{}
	body := e.esAny(t, "POST", "/"+e.index+"/_search?scroll=1m", `{"size":5000,"version":true,"_source":false,"sort":["_doc"]}`)
	for {
		var r struct {
			ScrollID string `json:"_scroll_id"`
			Hits     struct {
				Hits []struct {
					ID      string `json:"_id"`
					Version int64  `json:"_version"`
				} `json:"hits"`
			} `json:"hits"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Hits.Hits) == 0 {
			e.esAny(t, "DELETE", "/_search/scroll", `{"scroll_id":"`+r.ScrollID+`"}`)
			break
		}
		for _, h := range r.Hits.Hits {
			visible[h.ID] = h.Version
		}
		body = e.esAny(t, "POST", "/_search/scroll", `{"scroll":"1m","scroll_id":"`+r.ScrollID+`"}`)
	}
	v := verdict{Visible: len(visible)}
	rows, err := pool.Query(ctx, `SELECT DISTINCT ON (source_id) source_id, version, op FROM "`+e.schema+`".events
		WHERE index_name = $1 ORDER BY source_id, version DESC`, e.index)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for rows.Next() {
		var sid, op string
		var ver int64
		if err := rows.Scan(&sid, &ver, &op); err != nil {
			t.Fatal(err)
		}
		v.Sources++
		seen[sid] = true
		got, ok := visible[sid]
		switch {
		case op == "delete" && ok:
			v.Resurrected++
		case op == "delete":
		case !ok:
			v.Missing++
		case got < ver:
			v.Stale++
		case got > ver:
			v.Ahead++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for sid := range visible {
		if !seen[sid] {
			v.Extra++
		}
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".dead_letters`).Scan(&v.DeadLetters); err != nil {
		t.Fatal(err)
	}
	return v
}

// converge waits until the outbox is drained and the index matches the
// projection, and returns how long that took and the final comparison.
func (e *clusterEnv) converge(t *testing.T, pool *pgxpool.Pool, limit time.Duration) (time.Duration, verdict) {
	t.Helper()
	start := time.Now()
	var v verdict
	for {
		st, err := relay.CollectStats(context.Background(), pool, e.schema)
		if err == nil && st.Backlog() == 0 {
			if v = e.compare(t, pool); v.clean() {
				return time.Since(start), v
			}
		}
		if time.Since(start) > limit {
			t.Fatalf("not converged after %s: backlog err %v, comparison %+v", limit, err, v)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("timed out after %s waiting until %s", limit, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}
