package indexer

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBulkBody(t *testing.T) {
	t.Parallel()

	t.Run("an action line is valid JSON addressed to the write alias, with escaped id and external version", func(t *testing.T) {
		b := appendAction(nil, "idx", "a\"b\\c\né", 7, external)
		var a struct {
			Index struct {
				Index       string `json:"_index"`
				ID          string `json:"_id"`
				Version     int64  `json:"version"`
				VersionType string `json:"version_type"`
			} `json:"index"`
		}
		if !strings.HasSuffix(string(b), "\n") || strings.Count(string(b), "\n") != 1 {
			t.Fatalf("not one line: %q", b)
		}
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if a.Index.Index != "idx-write" || a.Index.ID != "a\"b\\c\né" || a.Index.Version != 7 || a.Index.VersionType != "external" {
			t.Fatalf("%+v", a)
		}
		if b := appendAction(nil, "i", "x", 1, externalGTE); !strings.Contains(string(b), `"version_type":"external_gte"`) {
			t.Fatalf("%s", b)
		}
	})

	t.Run("a tombstone carries the deleted flag and time", func(t *testing.T) {
		var d struct {
			Deleted bool   `json:"outboxd_deleted"`
			At      string `json:"outboxd_deleted_at"`
		}
		if err := json.Unmarshal(appendTombstone(nil, "2025-01-02T03:04:05.000Z"), &d); err != nil || !d.Deleted || d.At != "2025-01-02T03:04:05.000Z" {
			t.Fatalf("%+v %v", d, err)
		}
	})

	t.Run("multi-line documents are compacted and one-line ones kept as they are", func(t *testing.T) {
		doc := []byte(`{"a":1}`)
		if got := oneLine(doc); &got[0] != &doc[0] {
			t.Fatal("copied a one-line document")
		}
		if got := string(oneLine([]byte("{\r\n \"a\": \"x\\ny\"\n}"))); got != `{"a":"x\ny"}` {
			t.Fatalf("got %q", got)
		}
	})

	t.Run("version conflict reasons are read", func(t *testing.T) {
		for reason, want := range map[string][3]int64{
			"[a]: version conflict, current version [5] is higher or equal to the one provided [5]": {5, 5, 1},
			"[a]: version conflict, current version [9] is higher than the one provided [3]":        {9, 3, 1},
			"something else": {0, 0, 0},
			"[a]: version conflict, current version [x] is higher or equal to the one provided [5]": {0, 5, 0},
		} {
			c, p, ok := ConflictVersions(reason)
			if ok != (want[2] == 1) || (ok && (c != want[0] || p != want[1])) {
				t.Errorf("%q: got %d %d %v", reason, c, p, ok)
			}
		}
	})

	t.Run("a successful answer is recognized without decoding", func(t *testing.T) {
		if !allSucceeded([]byte(`{"errors":false,"items":[]}`)) || allSucceeded([]byte(`{"errors":true,"items":[]}`)) {
			t.Fatal("wrong")
		}
	})
}

func BenchmarkAppendBody(b *testing.B) {
	doc := []byte(`{"title":"document 123456","n":123456,"tag":"bench"}`)
	buf := make([]byte, 0, 1<<20)
	b.ReportAllocs()
	for i := range b.N {
		buf = buf[:0]
		for j := range 1000 {
			buf = appendAction(buf, "bench-index", "source-123456", int64(i+j), external)
			buf = append(buf, oneLine(doc)...)
			buf = append(buf, '\n')
		}
	}
	b.SetBytes(int64(len(buf)))
}
