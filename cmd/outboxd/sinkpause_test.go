package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
)

// README, "Configuration": an --index-spec Elasticsearch would refuse
// stops the relay at start, before it takes any event.
func TestRelayCommandRefusesAnInvalidIndexSpec(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	e.append(t, schematest.Name("spec-"), "s1", `{"title":"x"}`)
	spec := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(spec, []byte(`{"mappings":{"properties":{"title":{"type":"txet"}}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append(append([]string{}, e.dbArgs...), "--elasticsearch-url", schematest.ElasticsearchURL(t), "--index-spec", spec, "--admin-addr", "")
	err := runRelay(ctx, args)
	if err == nil || !strings.Contains(err.Error(), "index-spec "+spec) || !strings.Contains(err.Error(), "[txet] declared on field [title]") {
		t.Fatalf("runRelay: %v, want an error naming the spec file and the field", err)
	}
	var streams int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".progress`).Scan(&streams); err != nil {
		t.Fatal(err)
	}
	if streams != 0 {
		t.Fatalf("%d streams started before the spec was refused", streams)
	}
}

// README, "Delivery guarantees": a bulk request Elasticsearch refuses
// whatever it carries (here a parameter an older server does not know)
// pauses the relay with the reason in /readyz and on the dashboard, and
// dead-letters nothing.
func TestRelayCommandPausesOnARefusedConfiguration(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	esURL := schematest.ElasticsearchURL(t)
	target, err := url.Parse(esURL)
	if err != nil {
		t.Fatal(err)
	}
	index := schematest.Name("pause-")
	t.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", esURL+"/"+index+"-000001?ignore_unavailable=true", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/_bulk") {
			rp.ServeHTTP(w, r)
			return
		}
		w.Header().Set("X-Elastic-Product", "Elasticsearch")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"type":"illegal_argument_exception","reason":"request [/_bulk] contains unrecognized parameter: [include_source_on_error]"},"status":400}`)
	}))
	t.Cleanup(proxy.Close)
	for _, id := range []string{"a", "b", "c"} {
		e.append(t, index, id, `{"title":"`+id+`"}`)
	}

	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		args := append(append([]string{}, e.dbArgs...), "--elasticsearch-url", proxy.URL, "--admin-addr", addr, "--admin-token", "",
			"--lease-interval", "100ms", "--backoff-max", "200ms", "--max-attempts", "2", "--shutdown-timeout", "1s")
		done <- runRelay(ctx, args)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	get := func(path string, v any) int {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		_ = json.NewDecoder(resp.Body).Decode(v)
		return resp.StatusCode
	}
	var ready struct {
		Checks map[string]string `json:"checks"`
	}
	schematest.Eventually(t, 20*time.Second, "/readyz reports the paused stream", func() bool {
		return get("/readyz", &ready) == http.StatusServiceUnavailable && strings.Contains(ready.Checks["sink"], "include_source_on_error")
	})
	if !strings.Contains(ready.Checks["sink"], "stream default paused") {
		t.Errorf("readyz sink check %q does not name the stream", ready.Checks["sink"])
	}
	var sum struct {
		Streams []struct {
			Stream string `json:"stream"`
			Paused string `json:"paused"`
		} `json:"streams"`
	}
	schematest.Eventually(t, 20*time.Second, "the dashboard's summary shows why the stream is paused", func() bool {
		if get("/api/summary", &sum) != http.StatusOK {
			return false
		}
		for _, s := range sum.Streams {
			if s.Stream == "default" && strings.Contains(s.Paused, "include_source_on_error") {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second) // more rounds than --max-attempts
	var dead int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".dead_letters`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 || e.backlog(t) != 3 {
		t.Fatalf("%d dead letters and backlog %d, want none and 3", dead, e.backlog(t))
	}
}

// openSearch1Fake answers like OpenSearch 1.3: the same JSON shapes as
// Elasticsearch, without the X-Elastic-Product header.
func openSearch1Fake(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/":
			io.WriteString(w, `{"name":"os-1","cluster_name":"docker-cluster","version":{"distribution":"opensearch","number":"1.3.20","minimum_wire_compatibility_version":"6.8.0"},"tagline":"The OpenSearch Project: https://opensearch.org/"}`)
		case strings.HasPrefix(r.URL.Path, "/_nodes"):
			io.WriteString(w, `{"nodes":{"n1":{"version":"1.3.20"}}}`)
		default:
			io.WriteString(w, `{"acknowledged":true}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// README, "Supported servers": the relay refuses a server it does not
// support (here OpenSearch 1.x) at start, naming it, before it takes any
// event.
func TestRelayCommandRefusesAnUnsupportedServerAtStart(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	e.append(t, schematest.Name("os-"), "s1", `{"title":"x"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append(append([]string{}, e.dbArgs...), "--elasticsearch-url", openSearch1Fake(t).URL, "--admin-addr", "")
	err := runRelay(ctx, args)
	if err == nil || !strings.Contains(err.Error(), "OpenSearch 1.3.20 is not supported; outboxd needs OpenSearch 2.0 or later") {
		t.Fatalf("runRelay: %v, want a refusal naming OpenSearch 1.3.20", err)
	}
	var streams int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".progress`).Scan(&streams); err != nil {
		t.Fatal(err)
	}
	if streams != 0 {
		t.Fatalf("%d streams started before the server was refused", streams)
	}
}

// docs/deploy.md: one dead node in ELASTICSEARCH_URL does not stop the
// relay from starting, wherever it is in the list (each start check may
// land on it).
func TestRelayCommandStartsWithADeadNodeInTheList(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	spec := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(spec, []byte(`{"settings":{"number_of_shards":1}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	live := schematest.ElasticsearchURL(t)
	for _, urls := range []string{"http://127.0.0.1:1," + live, live + ",http://127.0.0.1:1"} {
		// Stopped as by a signal, once it had the time to fail at start.
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(3*time.Second, cancel)
		args := append(append([]string{}, e.dbArgs...), "--elasticsearch-url", urls, "--index-spec", spec, "--admin-addr", "", "--shutdown-timeout", "1s")
		err := runRelay(ctx, args)
		stop.Stop()
		cancel()
		if err != nil {
			t.Fatalf("relay with %s: %v, want it to run until stopped", urls, err)
		}
	}
}
