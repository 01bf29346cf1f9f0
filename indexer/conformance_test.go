package indexer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/relay/relaytest"
	"github.com/outboxd/outboxd/schema/schematest"
)

var _ relay.Sink = (*Sink)(nil)

// conformanceSpec maps rev as an integer, so that a document with a text
// rev is one Elasticsearch itself refuses (a 400 item), not the sink.
const conformanceSpec = `{"settings":{"index":{"number_of_shards":1,"number_of_replicas":0}},"mappings":{"properties":{"key":{"type":"keyword"},"rev":{"type":"integer"}}}}`

// TestConformance runs the sink conformance suite against the real
// Elasticsearch: the sink talks to it through a TCP proxy (cut: the port
// refuses connections; stall: requests held and lost) in front of an HTTP
// proxy that counts the index operations Elasticsearch acknowledged per
// document and can answer 503 to every request.
func TestConformance(t *testing.T) {
	t.Parallel()
	relaytest.Exercise(t, func(t *testing.T) relaytest.Harness {
		es, name := setup(t)
		target := newCountingProxy(t)
		front := relaytest.NewProxy(t, target.Listener.Addr().String())
		s := newSink(t, Options{Client: client(t, "http://"+front.Addr()), IndexSpec: []byte(conformanceSpec)})
		return relaytest.Harness{
			Sink: s,
			Event: func(t *testing.T, key string, rev int) outbox.Event {
				return upsert(name, key, int64(rev), fmt.Sprintf(`{"key":%q,"rev":%d}`, key, rev))
			},
			Bad: func(t *testing.T, key string) outbox.Event {
				return upsert(name, key, 1, fmt.Sprintf(`{"key":%q,"rev":"not a number"}`, key))
			},
			Observe: func(t *testing.T, key string) relaytest.Effect {
				eff := relaytest.Effect{Writes: target.writesOf(key)}
				if d := getDoc(t, es, name, key); d.Found {
					var src struct {
						Rev int `json:"rev"`
					}
					if err := json.Unmarshal(d.Source, &src); err != nil {
						t.Fatalf("document %s: %v", key, err)
					}
					eff.Rev = src.Rev
				}
				return eff
			},
			Outages: []relaytest.Outage{
				{Name: "Elasticsearch refuses connections", Begin: func(*testing.T) func() { return front.Cut() }},
				{Name: "Elasticsearch answers 503 to every request", Begin: func(*testing.T) func() {
					target.unavailable.Store(true)
					return func() { target.unavailable.Store(false) }
				}},
			},
			Stall: func(*testing.T) (<-chan struct{}, func()) { return front.Stall() },
		}
	})
}

// countingProxy forwards to the test's Elasticsearch and counts, per
// document id, the index operations of bulk requests that Elasticsearch
// answered 2xx: the writes that took effect, whether or not the sink got
// the answer.
type countingProxy struct {
	*httptest.Server
	unavailable atomic.Bool

	mu     sync.Mutex
	writes map[string]int
}

func newCountingProxy(t *testing.T) *countingProxy {
	t.Helper()
	u, err := url.Parse(schematest.ElasticsearchURL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{writes: make(map[string]int)}
	rp := httputil.NewSingleHostReverseProxy(u)
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.unavailable.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"type":"cluster_block_exception","reason":"injected: blocked by: [SERVICE_UNAVAILABLE/2/no master];"},"status":503}`)
			return
		}
		if !strings.HasSuffix(r.URL.Path, "/_bulk") {
			rp.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		// Forwarded whatever the sink does meanwhile: once sent, the
		// request's effect is counted even if the sink gave up on it.
		r2 := r.Clone(context.WithoutCancel(r.Context()))
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		r2.Header.Set("Content-Length", strconv.Itoa(len(body)))
		r2.Header.Del("Accept-Encoding") // read here, not passed through
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r2)
		if rec.Code == http.StatusOK {
			p.count(body, rec.Body.Bytes())
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(p.Close)
	return p
}

// count adds the acknowledged index operations of one bulk request.
func (p *countingProxy) count(body, answer []byte) {
	var ids []string // per action: the document id of an index operation, "" for another
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var a map[string]struct {
			ID string `json:"_id"`
		}
		_ = json.Unmarshal(sc.Bytes(), &a)
		id := ""
		if op, ok := a["index"]; ok {
			id = op.ID
		}
		ids = append(ids, id)
		sc.Scan() // the source line
	}
	var res struct {
		Items []map[string]struct {
			Status int `json:"status"`
		} `json:"items"`
	}
	if json.Unmarshal(answer, &res) != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, it := range res.Items {
		if i >= len(ids) || ids[i] == "" {
			continue
		}
		if st := it["index"].Status; st >= 200 && st < 300 {
			p.writes[ids[i]]++
		}
	}
}

func (p *countingProxy) writesOf(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.writes[id]
}
