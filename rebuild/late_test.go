package rebuild

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// holdingProxy forwards to Elasticsearch and holds a request carrying the
// header X-Test-Hold until release is closed.
func holdingProxy(t *testing.T, release <-chan struct{}) string {
	t.Helper()
	target, err := url.Parse(schematest.ElasticsearchURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Hold") != "" {
			<-release
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestRebuildLateBulkReachesNewIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setupRebuild(t, 10)
	old := indexer.FirstIndex(e.Name)
	release := make(chan struct{})
	proxy := holdingProxy(t, release)
	// A bulk that resolved N-write to the old index before the swap (as a
	// coordinating node does) and is applied only after the rebuild's
	// grace and final catch-up: sent before the swap, held by the proxy
	// until the rebuild has finished.
	type answer struct {
		status int
		body   string
	}
	late := make(chan answer, 1)
	var sendOnce, releaseOnce sync.Once
	send := func() {
		go func() {
			req, _ := http.NewRequest("POST", proxy+"/_bulk", strings.NewReader(`{"index":{"_index":"`+old+`","_id":"a0000001","version":50,"version_type":"external"}}`+"\n"+`{"title":"late"}`+"\n"))
			req.Header.Set("Content-Type", "application/x-ndjson")
			req.Header.Set("X-Test-Hold", "1")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				late <- answer{0, err.Error()}
				return
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			late <- answer{res.StatusCode, string(b)}
		}()
	}
	o := rebuildOpts(e)
	o.Grace = 100 * time.Millisecond
	o.Logger = slog.New(multiOnLog{
		"rebuild caught up": func() { sendOnce.Do(send) },
		"rebuild finished":  func() { releaseOnce.Do(func() { close(release) }) },
	})
	rep, err := Run(ctx, o)
	if err != nil || !rep.Swapped {
		t.Fatalf("rebuild: %+v, %v", rep, err)
	}
	a := <-late
	acknowledged := a.status == 200 && !strings.Contains(a.body, `"errors":true`)
	t.Logf("the late bulk: HTTP %d %s", a.status, a.body)
	if acknowledged {
		if d := estest.Get(t, e.ES, e.Name, "a0000001"); d.Version != 50 {
			t.Fatalf("a bulk acknowledged on the old index after the swap is not in the new one: %+v", d)
		}
	} else if !strings.Contains(a.body, "cluster_block_exception") {
		t.Fatalf("the late bulk failed otherwise: HTTP %d %s", a.status, a.body)
	}

	// The relay's sink retries an item refused by the block instead of
	// dead-lettering it: the retry resolves N-write to the new index.
	if st, b := estest.Call(t, e.ES, "PUT", "/"+rep.NewIndex+"/_block/write", ""); st != 200 {
		t.Fatalf("block: %d %s", st, b)
	}
	out := estest.MustWrite(t, tooltest.NewSink(t, indexer.Options{Client: e.ES}), estest.Upsert(e.Name, "a0000002", 70, `{"title":"blocked"}`))
	if st, b := estest.Call(t, e.ES, "PUT", "/"+rep.NewIndex+"/_settings", `{"index.blocks.write":false}`); st != 200 {
		t.Fatalf("unblock: %d %s", st, b)
	}
	if out[0].Status != outbox.Retry {
		t.Fatalf("a write refused by an index write block: %+v; want it retried", out[0])
	}
}
