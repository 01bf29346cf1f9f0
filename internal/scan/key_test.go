package scan

import (
	"encoding/json"
	"testing"

	"github.com/outboxd/outboxd/internal/estest"
)

func TestKey(t *testing.T) {
	t.Parallel()
	hit := func(id, src string) Hit {
		return Hit{Index: "i", ID: id, Version: 7, Source: json.RawMessage(src)}
	}
	t.Run("source_id falls back to _id", func(t *testing.T) {
		k, d, ok, err := Key(hit("abc", `{"title":"x"}`), []string{"source_id"}, "version", "updated_at")
		if err != nil || !ok || k != "abc" || d.Version != 7 {
			t.Fatalf("%q %+v %v %v", k, d, ok, err)
		}
	})
	t.Run("the version field wins over _version", func(t *testing.T) {
		k, d, ok, _ := Key(hit("r", `{"source_id":"s","version":3,"updated_at":"2024-01-01T00:00:00Z"}`), []string{"source_id"}, "version", "updated_at")
		if !ok || k != "s" || d.Version != 3 || d.ESVersion != 7 || d.Updated == "" {
			t.Fatalf("%q %+v", k, d)
		}
	})
	t.Run("a missing key field makes the document ungroupable", func(t *testing.T) {
		_, _, ok, _ := Key(hit("r", `{"source_id":"s"}`), []string{"canonical_url"}, "version", "")
		if ok {
			t.Fatal("grouped without a key")
		}
	})
	t.Run("a composite key joins nested fields", func(t *testing.T) {
		k, _, ok, _ := Key(hit("r", `{"tenant":{"id":"t1"},"sku":42}`), []string{"tenant.id", "sku"}, "version", "")
		if !ok || k != `["t1","42"]` {
			t.Fatalf("%q", k)
		}
	})
	t.Run("a tombstone is recognized", func(t *testing.T) {
		_, d, _, _ := Key(hit("s", estest.Tombstone), []string{"source_id"}, "version", "")
		if !d.Tombstone {
			t.Fatal("not a tombstone")
		}
	})
}
