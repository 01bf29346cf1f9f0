package documents_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/tooltest"
)

// esProxy stands between the relay and Elasticsearch and drives the
// proof's faults from the relay's own progress: it counts the relay's
// bulk requests and, at the counts of the plan, asks for the relay to be
// killed (the bulk request that reached it is forwarded after the kill,
// as a write of a dead process that was already on the wire) or holds
// every bulk request for stall (Elasticsearch not answering writes).
type esProxy struct {
	srv     *httptest.Server
	target  string
	client  *http.Client
	bulks   atomic.Int64 // since the relay last started
	total   atomic.Int64
	kills   []int64 // bulk counts, per relay run, at which it is killed
	stallAt int64   // the bulk count of the run after the second kill that starts the stall
	stall   time.Duration

	mu       sync.Mutex
	run      int       // relay runs started before this one
	until    time.Time // bulk requests wait until then
	stalled  int
	killReq  chan struct{} // to the test: kill the relay now
	killDone chan struct{} // from the test: killed
	noKills  chan struct{} // closed when the test kills no more
}

func newESProxy(t *testing.T, target string, kills []int64, stallAt int64, stall time.Duration) *esProxy {
	p := &esProxy{target: strings.TrimRight(target, "/"), client: &http.Client{Timeout: 2 * time.Minute},
		kills: kills, stallAt: stallAt, stall: stall, killReq: make(chan struct{}), killDone: make(chan struct{}), noKills: make(chan struct{})}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *esProxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	if strings.HasSuffix(r.URL.Path, "/_bulk") {
		p.total.Add(1)
		n := p.bulks.Add(1)
		p.mu.Lock()
		run := p.run
		if run == 2 && n == p.stallAt {
			p.until = time.Now().Add(p.stall)
			p.stalled++
		}
		until := p.until
		kill := run < len(p.kills) && n == p.kills[run]
		p.mu.Unlock()
		time.Sleep(time.Until(until))
		if kill {
			select {
			case p.killReq <- struct{}{}:
				<-p.killDone
			case <-p.noKills:
			}
		}
	}
	// Sent on with a context of its own: a request whose relay was killed
	// still reaches Elasticsearch.
	req, err := http.NewRequestWithContext(context.Background(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	res, err := p.client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	_, _ = io.Copy(w, res.Body)
}

// stopKilling tells the proxy the test asks for no more kills.
func (p *esProxy) stopKilling() { close(p.noKills) }

// restarted counts a new relay run.
func (p *esProxy) restarted() {
	p.mu.Lock()
	p.run++
	p.mu.Unlock()
	p.bulks.Store(0)
}

// relayProcess is `outboxd relay` run as a child process, its output in
// the test's temporary directory.
type relayProcess struct {
	cmd  *exec.Cmd
	logs *os.File
}

func startRelayProcess(t *testing.T, bin, schemaName, esURL string, run int) *relayProcess {
	t.Helper()
	logs, err := os.Create(filepath.Join(t.TempDir(), fmt.Sprintf("relay-%d.log", run)))
	if err != nil {
		t.Fatal(err)
	}
	cmd := tooltest.RelayCommand(t, bin, schemaName, esURL)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return &relayProcess{cmd: cmd, logs: logs}
}

// kill SIGKILLs the relay; again is a no-op.
func (r *relayProcess) kill() {
	if r.cmd.ProcessState == nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.logs.Close()
	}
}

// poller reads random documents through the name N, as a reader of the
// index would (all its ids in one _mget, again and again), and records any
// that went back to an older state than one it read before: a counter
// lower than seen, or a document back with the counter it had before a
// delete was seen.
type poller struct {
	ids         []string
	done        chan struct{}
	wg          sync.WaitGroup
	reads, gone atomic.Int64 // documents read; of them, deleted ones
	requests    atomic.Int64
	mu          sync.Mutex
	regressions []string
	errors      atomic.Int64
}

type seen struct {
	bump, lookupBump int64
	deletedAfter     bool // a delete was read after the highest bump
}

func startPoller(t *testing.T, es string, name string, n int) *poller {
	t.Helper()
	p := &poller{done: make(chan struct{})}
	rnd := rand.New(rand.NewPCG(5, 5))
	for len(p.ids) < n {
		if id := fmt.Sprint(1 + rnd.IntN(proofParents)); !slices.Contains(p.ids, id) {
			p.ids = append(p.ids, id)
		}
	}
	body, _ := json.Marshal(map[string]any{"ids": p.ids})
	client := &http.Client{Timeout: 30 * time.Second}
	state := map[string]*seen{}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			select {
			case <-p.done:
				return
			default:
			}
			docs, err := mget(client, es+"/"+name+"/_mget?realtime=true", body)
			p.requests.Add(1)
			if err != nil {
				p.errors.Add(1)
				time.Sleep(10 * time.Millisecond)
				continue
			}
			for _, d := range docs {
				p.check(state, d)
			}
		}
	}()
	return p
}

type polled struct {
	ID     string `json:"_id"`
	Found  bool   `json:"found"`
	Source struct {
		Bump       *int64 `json:"bump"`
		LookupBump *int64 `json:"lookup_bump"`
		Deleted    bool   `json:"outboxd_deleted"`
	} `json:"_source"`
}

func mget(client *http.Client, url string, body []byte) ([]polled, error) {
	res, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("mget: %s", res.Status)
	}
	var r struct {
		Docs []polled `json:"docs"`
	}
	err = json.NewDecoder(res.Body).Decode(&r)
	return r.Docs, err
}

func (p *poller) check(state map[string]*seen, d polled) {
	p.reads.Add(1)
	s := state[d.ID]
	live := d.Found && !d.Source.Deleted && d.Source.Bump != nil && d.Source.LookupBump != nil
	switch {
	case !live && s != nil:
		s.deletedAfter = true
		p.gone.Add(1)
	case !live:
	case s == nil:
		state[d.ID] = &seen{bump: *d.Source.Bump, lookupBump: *d.Source.LookupBump}
	default:
		b, l := *d.Source.Bump, *d.Source.LookupBump
		if b < s.bump || l < s.lookupBump || (s.deletedAfter && b <= s.bump) {
			p.mu.Lock()
			p.regressions = append(p.regressions, fmt.Sprintf("parent %s: read bump %d lookup_bump %d after bump %d lookup_bump %d (deleted since: %t)", d.ID, b, l, s.bump, s.lookupBump, s.deletedAfter))
			p.mu.Unlock()
		}
		if b > s.bump {
			s.bump, s.deletedAfter = b, false
		}
		s.lookupBump = max(s.lookupBump, l)
	}
}

func (p *poller) stop() {
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	p.wg.Wait()
}
