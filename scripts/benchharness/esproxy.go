package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/indexer"
)

// esProxy stands between an `outboxd relay` child and Elasticsearch and
// watches its _bulk requests: when Elasticsearch's answer to one has
// arrived, every document id in it is acknowledged at that instant. That
// is the relay's "acknowledged by Elasticsearch" moment to within a
// loopback hop, taken from the real binary with whatever flags it runs
// with, and it counts the relay's bulk requests exactly (the shared
// cluster's own statistics include everyone else's).
type esProxy struct {
	url   string // what the relay is given as --elasticsearch-url
	srv   *http.Server
	inner http.RoundTripper

	requests atomic.Int64 // every request
	starts   atomic.Int64 // _bulk requests sent
	bulks    atomic.Int64 // _bulk requests answered
	docs     atomic.Int64 // actions in them
	inFlight atomic.Int64
	lastAck  atomic.Int64 // unix nanos of the last answer

	mu      sync.Mutex
	answers []bulkAnswer

	// onAck, when set, is called with every document id of an answered
	// bulk request and the time of the answer.
	onAck atomic.Pointer[func(id []byte, at int64)]
}

// startESProxy is the proxy in front of the run's Elasticsearch, which the
// scenarios that run `outboxd relay` need.
func (b *bench) startESProxy() (*esProxy, error) {
	if b.es == nil {
		return nil, fmt.Errorf("ELASTICSEARCH_URL: not set")
	}
	return startESProxy()
}

func startESProxy() (*esProxy, error) {
	target, err := url.Parse(indexer.SplitAddresses(os.Getenv("ELASTICSEARCH_URL"))[0])
	if err != nil {
		return nil, fmt.Errorf("ELASTICSEARCH_URL: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &esProxy{url: "http://" + l.Addr().String(),
		inner: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, TLSClientConfig: http.DefaultTransport.(*http.Transport).TLSClientConfig}}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = p
	// The relay sees the errors; its shutdown cancelling a request is no news.
	rp.ErrorLog = log.New(io.Discard, "", 0)
	p.srv = &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(l) }()
	return p, nil
}

func (p *esProxy) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
}

func (p *esProxy) RoundTrip(req *http.Request) (*http.Response, error) {
	p.requests.Add(1)
	if !strings.HasSuffix(req.URL.Path, "/_bulk") {
		return p.inner.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	p.starts.Add(1)
	sent := time.Now()
	p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	res, err := p.inner.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	out, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(out))
	now := time.Now().UnixNano()
	p.lastAck.Store(now)
	p.mu.Lock()
	p.answers = append(p.answers, bulkAnswer{at: now, took: time.Since(sent)})
	p.mu.Unlock()
	p.bulks.Add(1)
	if res.StatusCode == http.StatusOK {
		p.docs.Add(int64(p.ack(body, now)))
	}
	return res, nil
}

// ack hands every action's _id to onAck and returns how many there were.
// Action lines are the sink's `{"index":{...,"_id":"..."...}}`; each is
// followed by its source line, which is skipped.
func (p *esProxy) ack(body []byte, at int64) int {
	fn := p.onAck.Load()
	n := 0
	source := false
	for len(body) > 0 {
		line, rest, _ := bytes.Cut(body, []byte{'\n'})
		body = rest
		if source {
			source = false
			continue
		}
		i := bytes.Index(line, []byte(`"_id":"`))
		if i < 0 {
			continue
		}
		n++
		source = !bytes.HasPrefix(line, []byte(`{"delete"`))
		if fn != nil {
			id := line[i+len(`"_id":"`):]
			if j := bytes.IndexByte(id, '"'); j >= 0 {
				(*fn)(id[:j], at)
			}
		}
	}
	return n
}

// bulkAnswer is one answered _bulk request: when, and how long
// Elasticsearch took (the part of a delivery's latency that is not the
// relay's).
type bulkAnswer struct {
	at   int64 // unix nanos
	took time.Duration
}

// answersSince are the bulk answers after t.
func (p *esProxy) answersSince(t time.Time) []bulkAnswer {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []bulkAnswer
	for _, a := range p.answers {
		if a.at >= t.UnixNano() {
			out = append(out, a)
		}
	}
	return out
}

// slowAnswer is an answer to a _bulk that took long enough to show in a
// low rate's p99 by itself. On this machine Elasticsearch answers so
// slowly about once a second, at its index refresh (refresh_interval 1s):
// with refresh_interval 30s those answers were gone and the --linger 0
// p99 fell from 11.7-24 ms to 7 ms (docs/benchmarks.md).
const slowAnswer = 25 * time.Millisecond

// bulkTimes is how long Elasticsearch took to answer the bulk requests
// after t: p50, p99, max, and how many took slowAnswer or longer.
func (p *esProxy) bulkTimes(t time.Time) (p50, p99, longest time.Duration, slow int) {
	var d []time.Duration
	for _, a := range p.answersSince(t) {
		d = append(d, a.took)
		if a.took >= slowAnswer {
			slow++
		}
	}
	if len(d) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(d)
	return pct(d, 0.5), pct(d, 0.99), d[len(d)-1], slow
}
