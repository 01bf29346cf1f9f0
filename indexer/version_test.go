package indexer

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fakeServer answers GET / and the node list like a server of the given
// distribution ("" for Elasticsearch, whose answers carry the product
// header) and version; it is for the detection only, which is pure logic
// over these two answers.
func fakeServer(t *testing.T, distribution, number string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if distribution == "" {
			w.Header().Set("X-Elastic-Product", "Elasticsearch")
		}
		switch {
		case r.URL.Path == "/" && distribution == "":
			// Elasticsearch's integ-test distribution has no GET /.
			w.WriteHeader(http.StatusMethodNotAllowed)
			io.WriteString(w, `{"error":"Incorrect HTTP method for uri [/] and method [GET], allowed: [POST]","status":405}`)
		case r.URL.Path == "/" && distribution == "landing-page":
			// A proxy in front of Elasticsearch that answers / itself.
			w.Header().Set("Content-Type", "text/html")
			io.WriteString(w, `<html><body>Search cluster</body></html>`)
		case r.URL.Path == "/":
			io.WriteString(w, `{"name":"n1","version":{"distribution":"`+distribution+`","number":"`+number+`"},"tagline":"The OpenSearch Project: https://opensearch.org/"}`)
		case strings.HasPrefix(r.URL.Path, "/_nodes"):
			io.WriteString(w, `{"nodes":{"n1":{"version":"`+number+`"}}}`)
		default:
			io.WriteString(w, `{"acknowledged":true}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestServerDetection(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		distribution, number string
		name                 string // Server's name, or "" when refused
		refusal              string
		sourceOnError        bool
	}{
		{"opensearch", "2.19.6", "OpenSearch 2.19.6", "", false},
		{"opensearch", "3.3.0", "OpenSearch 3.3.0", "", false},
		{"", "8.19.14", "Elasticsearch 8.19.14", "", true},
		{"", "8.0.1", "Elasticsearch 8.0.1", "", false},
		{"", "9.2.4", "Elasticsearch 9.2.4", "", true},
		{"landing-page", "8.19.14", "Elasticsearch 8.19.14", "", true},
		{"opensearch", "1.3.20", "", "OpenSearch 1.3.20 is not supported; outboxd needs OpenSearch 2.0 or later", false},
		{"", "7.17.28", "", "Elasticsearch 7.17.28 is not supported; outboxd needs Elasticsearch 8.0 or later", false},
		{"fakesearch", "1.0.0", "", "the server is fakesearch 1.0.0: outboxd supports Elasticsearch 8.0 and later and OpenSearch 2.0 and later", false},
	} {
		t.Run(c.distribution+" "+c.number, func(t *testing.T) {
			t.Parallel()
			es, err := NewClient(ClientConfig{Addresses: []string{fakeServer(t, c.distribution, c.number)}})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			err = CheckServer(ctx, es)
			name, _, _ := Server(ctx, es)
			s := newSink(t, Options{Client: es})
			v, verr := s.version(ctx)
			if c.refusal != "" {
				if err == nil || !strings.Contains(err.Error(), c.refusal) {
					t.Fatalf("CheckServer: %v, want %q", err, c.refusal)
				}
				if !IsConfig(verr) || !strings.Contains(verr.Error(), c.refusal) {
					t.Fatalf("the sink's version: %v, want a configuration error %q", verr, c.refusal)
				}
				return
			}
			if err != nil || name != c.name || verr != nil || v.String() != c.name {
				t.Fatalf("CheckServer: %v; Server: %q; the sink's version: %v %v; want %s", err, name, v, verr, c.name)
			}
			if v.sourceOnErrorParam() != c.sourceOnError {
				t.Fatalf("%s: include_source_on_error %v, want %v", c.name, v.sourceOnErrorParam(), c.sourceOnError)
			}
		})
	}
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
