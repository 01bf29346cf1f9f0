package indexer

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// openSearchLike answers like OpenSearch 2.x: Elasticsearch's JSON shapes
// without the X-Elastic-Product header.
func openSearchLike(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/":
			io.WriteString(w, `{"name":"os-1","version":{"distribution":"opensearch","number":"2.11.0"},"tagline":"The OpenSearch Project: https://opensearch.org/"}`)
		case strings.HasPrefix(r.URL.Path, "/_nodes"):
			io.WriteString(w, `{"nodes":{"n1":{"version":"2.11.0"}}}`)
		default:
			io.WriteString(w, `{"acknowledged":true}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestOpenSearchIsRefused(t *testing.T) {
	t.Parallel()
	es, err := NewClient(ClientConfig{Addresses: []string{openSearchLike(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("CheckServer names OpenSearch and its version", func(t *testing.T) {
		err := CheckServer(context.Background(), es)
		if err == nil || !strings.Contains(err.Error(), "OpenSearch 2.11.0, not Elasticsearch") {
			t.Fatalf("CheckServer: %v", err)
		}
	})
	t.Run("the sink pauses on it as a configuration error, not an outage", func(t *testing.T) {
		s := newSink(t, Options{Client: es})
		_, err := s.Write(context.Background(), []outbox.Event{upsert("os-test", "a", 1, `{"x":1}`)})
		if !IsConfig(err) || !strings.Contains(err.Error(), "OpenSearch") {
			t.Fatalf("Write: %v, want a configuration error naming OpenSearch", err)
		}
	})
	t.Run("a server that does not answer passes the start check", func(t *testing.T) {
		dead, err := NewClient(ClientConfig{Addresses: []string{"http://127.0.0.1:1"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckServer(context.Background(), dead); err != nil {
			t.Fatalf("CheckServer on a server that is down: %v; the relay should start and report the outage", err)
		}
	})
}
