package main

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
)

// Every document of a bulk request Elasticsearch answered is acknowledged
// once, index and delete actions alike, and the requests are counted.
func TestESProxyAcksEveryDocument(t *testing.T) {
	schematest.ElasticsearchURL(t)
	p, err := startESProxy()
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	var mu sync.Mutex
	var ids []string
	fn := func(id []byte, _ int64) {
		mu.Lock()
		ids = append(ids, string(id))
		mu.Unlock()
	}
	p.onAck.Store(&fn)
	index := schematest.Name("bench-proxy-test")
	defer func() {
		req, _ := http.NewRequest(http.MethodDelete, p.url+"/"+index, nil)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	body := `{"index":{"_index":"` + index + `","_id":"doc-1"}}
{"n": 1, "note": "a \"_id\":\"doc-9\" inside a source is not an action"}
{"index":{"_index":"` + index + `","_id":"doc-2"}}
{"n": 2}
{"delete":{"_index":"` + index + `","_id":"doc-1"}}
`
	res, err := http.Post(p.url+"/_bulk", "application/x-ndjson", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("bulk through the proxy: %s", res.Status)
	}
	if want := []string{"doc-1", "doc-2", "doc-1"}; !slices.Equal(ids, want) {
		t.Fatalf("acknowledged ids = %q, want %q", ids, want)
	}
	if p.bulks.Load() != 1 || p.docs.Load() != 3 || len(p.answersSince(time.Unix(0, 0))) != 1 {
		t.Fatalf("bulks = %d, docs = %d, answers = %d; want 1, 3, 1", p.bulks.Load(), p.docs.Load(), len(p.answersSince(time.Unix(0, 0))))
	}
}
