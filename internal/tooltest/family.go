package tooltest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/internal/estest"
)

// Family is a test index family made with raw API calls, following
// the conventions without depending on Bootstrap: concrete N-000001 (the
// write index), optionally an older N-000000 behind the same write alias
// N, and the filtered read alias N-read. Its concrete indices are deleted
// when the test ends.
type Family struct {
	ES    *elasticsearch.Client
	Name  string // N
	Write string // N-000001
	Old   string // N-000000; "" unless two indices were asked for
}

// familyMapping maps the fields the tools rank and group by.
const familyMapping = `{"settings":{"number_of_shards":1,"number_of_replicas":0},"mappings":{"properties":{
		"outboxd_deleted":{"type":"boolean"},"outboxd_deleted_at":{"type":"date"},
		"source_id":{"type":"keyword"},"canonical_url":{"type":"keyword"},"version":{"type":"long"},"updated_at":{"type":"date"}}}}`

// NewFamily creates N-000001 and, with twoIndices, N-000000 too.
func NewFamily(t testing.TB, twoIndices bool) *Family {
	t.Helper()
	es, name := Index(t, "repair-")
	f := &Family{ES: es, Name: name, Write: name + "-000001"}
	f.Raw(t, "PUT", "/"+f.Write, familyMapping)
	readFilter := `"filter":{"bool":{"must_not":{"term":{"outboxd_deleted":true}}}}`
	actions := []string{
		fmt.Sprintf(`{"add":{"index":%q,"alias":%q,"is_write_index":true}}`, f.Write, f.Name),
		fmt.Sprintf(`{"add":{"index":%q,"alias":%q,%s}}`, f.Write, f.Name+"-read", readFilter),
	}
	if twoIndices {
		f.Old = f.Name + "-000000"
		f.Raw(t, "PUT", "/"+f.Old, familyMapping)
		actions = append(actions,
			fmt.Sprintf(`{"add":{"index":%q,"alias":%q,"is_write_index":false}}`, f.Old, f.Name),
			fmt.Sprintf(`{"add":{"index":%q,"alias":%q,%s}}`, f.Old, f.Name+"-read", readFilter))
	}
	f.Raw(t, "POST", "/_aliases", `{"actions":[`+strings.Join(actions, ",")+`]}`)
	return f
}

// Raw sends a request and fails the test on a non-2xx answer; it returns
// the body.
func (f *Family) Raw(t testing.TB, method, path, body string) []byte {
	t.Helper()
	return estest.Must(t, f.ES, method, path, body)
}

// Put indexes one document; version 0 means internal versioning (a
// legacy writer), otherwise external_gte like the sink.
func (f *Family) Put(t testing.TB, index, id string, version int64, body string) {
	t.Helper()
	path := "/" + index + "/_doc/" + id
	if version > 0 {
		path += fmt.Sprintf("?version=%d&version_type=external_gte", version)
	}
	f.Raw(t, "PUT", path, body)
}

// Refresh refreshes the family's concrete indices.
func (f *Family) Refresh(t testing.TB) {
	t.Helper()
	f.Raw(t, "POST", "/"+f.Name+"-0*/_refresh", "")
}

// SnapDoc is a document as the tests compare it.
type SnapDoc struct {
	Version int64
	SeqNo   int64
	Source  string // compacted
}

// Snapshot reads every document of the family, tombstones and whole
// sources included, by index/_id. It scrolls with raw requests rather
// than through internal/scan, which some of its callers test.
func (f *Family) Snapshot(t testing.TB) map[string]SnapDoc {
	t.Helper()
	f.Refresh(t)
	indices := f.Write
	if f.Old != "" {
		indices += "," + f.Old
	}
	out := map[string]SnapDoc{}
	b := f.Raw(t, "POST", "/"+indices+"/_search?scroll=1m", `{"size":1000,"version":true,"seq_no_primary_term":true,"sort":["_doc"]}`)
	for {
		var page struct {
			ScrollID string `json:"_scroll_id"`
			Hits     struct {
				Hits []struct {
					Index   string          `json:"_index"`
					ID      string          `json:"_id"`
					Version int64           `json:"_version"`
					SeqNo   int64           `json:"_seq_no"`
					Source  json.RawMessage `json:"_source"`
				} `json:"hits"`
			} `json:"hits"`
		}
		if err := json.Unmarshal(b, &page); err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		if len(page.Hits.Hits) == 0 {
			estest.Call(t, f.ES, "DELETE", "/_search/scroll", `{"scroll_id":"`+page.ScrollID+`"}`)
			return out
		}
		for _, h := range page.Hits.Hits {
			var buf bytes.Buffer
			if err := json.Compact(&buf, h.Source); err != nil {
				t.Fatalf("snapshot: %s/%s: %v", h.Index, h.ID, err)
			}
			out[h.Index+"/"+h.ID] = SnapDoc{Version: h.Version, SeqNo: h.SeqNo, Source: buf.String()}
		}
		b = f.Raw(t, "POST", "/_search/scroll", `{"scroll":"1m","scroll_id":"`+page.ScrollID+`"}`)
	}
}

// Visible returns the index/_ids a searcher sees through the read alias,
// sorted.
func (f *Family) Visible(t testing.TB) []string {
	t.Helper()
	f.Refresh(t)
	b := f.Raw(t, "POST", "/"+f.Name+"-read/_search", `{"size":1000}`)
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
