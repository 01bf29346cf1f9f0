package rebuild

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/scan"
	"github.com/outboxd/outboxd/schema/schematest"
)

// testIndex is a test index family made with raw API calls, following
// the conventions without depending on Bootstrap: concrete N-000001 (the
// write index), optionally an older N-000000 behind the same write alias
// N, and the filtered read alias N-read.
type testIndex struct {
	es    *elasticsearch.Client
	name  string
	write string
	old   string // "" unless two indices were asked for
}

func setupIndex(t testing.TB, twoIndices bool) *testIndex {
	t.Helper()
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{schematest.ElasticsearchURL(t)}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ri := &testIndex{es: es, name: schematest.Name("repair-"), write: ""}
	ri.write = ri.name + "-000001"
	mapping := `{"settings":{"number_of_shards":1,"number_of_replicas":0},"mappings":{"properties":{
		"outboxd_deleted":{"type":"boolean"},"outboxd_deleted_at":{"type":"date"},
		"source_id":{"type":"keyword"},"canonical_url":{"type":"keyword"},"version":{"type":"long"},"updated_at":{"type":"date"}}}}`
	ri.raw(t, "PUT", "/"+ri.write, mapping)
	t.Cleanup(func() {
		res, err := esapi.IndicesDeleteRequest{Index: []string{ri.name + "-0*"}}.Do(context.Background(), es)
		if err == nil {
			res.Body.Close()
		}
	})
	actions := []string{
		fmt.Sprintf(`{"add":{"index":%q,"alias":%q,"is_write_index":true}}`, ri.write, ri.name),
		fmt.Sprintf(`{"add":{"index":%q,"alias":%q,"filter":{"bool":{"must_not":{"term":{"outboxd_deleted":true}}}}}}`, ri.write, ri.name+"-read"),
	}
	if twoIndices {
		ri.old = ri.name + "-000000"
		ri.raw(t, "PUT", "/"+ri.old, mapping)
		actions = append(actions,
			fmt.Sprintf(`{"add":{"index":%q,"alias":%q,"is_write_index":false}}`, ri.old, ri.name),
			fmt.Sprintf(`{"add":{"index":%q,"alias":%q,"filter":{"bool":{"must_not":{"term":{"outboxd_deleted":true}}}}}}`, ri.old, ri.name+"-read"))
	}
	ri.raw(t, "POST", "/_aliases", `{"actions":[`+strings.Join(actions, ",")+`]}`)
	return ri
}

// raw sends a request and fails the test on a non-2xx answer.
func (ri *testIndex) raw(t testing.TB, method, path, body string) []byte {
	t.Helper()
	b, status := ri.rawStatus(t, method, path, body)
	if status >= 300 {
		t.Fatalf("%s %s: status %d: %s", method, path, status, b)
	}
	return b
}

func (ri *testIndex) rawStatus(t testing.TB, method, path, body string) ([]byte, int) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := newHTTPRequest(method, path, rd)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ri.es.Perform(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return b, res.StatusCode
}

// put indexes one document; version 0 means internal versioning (a
// legacy writer), otherwise external_gte like the sink.
func (ri *testIndex) put(t testing.TB, index, id string, version int64, body string) {
	t.Helper()
	path := "/" + index + "/_doc/" + id
	if version > 0 {
		path += fmt.Sprintf("?version=%d&version_type=external_gte", version)
	}
	ri.raw(t, "PUT", path, body)
}

func (ri *testIndex) refresh(t testing.TB) {
	t.Helper()
	ri.raw(t, "POST", "/"+ri.name+"-0*/_refresh", "")
}

// snapDoc is a document as the tests compare it.
type snapDoc struct {
	Version int64
	SeqNo   int64
	Source  string
}

// snapshot reads every document of the family, whole sources included.
func (ri *testIndex) snapshot(t testing.TB) map[string]snapDoc {
	t.Helper()
	ri.refresh(t)
	out := map[string]snapDoc{}
	indices := []string{ri.write}
	if ri.old != "" {
		indices = append(indices, ri.old)
	}
	err := scan.Each(context.Background(), ri.es, scan.Options{Indices: indices, PageSize: 7}, func(h scan.Hit) error {
		var buf bytes.Buffer
		if err := json.Compact(&buf, h.Source); err != nil {
			return err
		}
		out[h.Index+"/"+h.ID] = snapDoc{Version: h.Version, SeqNo: h.SeqNo, Source: buf.String()}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// visible returns the _ids a searcher sees through the read alias.
func (ri *testIndex) visible(t testing.TB) []string {
	t.Helper()
	ri.refresh(t)
	b := ri.raw(t, "POST", "/"+ri.name+"-read/_search", `{"size":1000}`)
	var res struct {
		Hits struct {
			Hits []struct {
				Index string `json:"_index"`
				ID    string `json:"_id"`
			} `json:"hits"`
		} `json:"hits"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, h := range res.Hits.Hits {
		ids = append(ids, h.Index+"/"+h.ID)
	}
	sort.Strings(ids)
	return ids
}

func tombstoneBody() string {
	return `{"outboxd_deleted":true,"outboxd_deleted_at":"2024-05-01T00:00:00Z"}`
}

func newHTTPRequest(method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequest(method, path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}
