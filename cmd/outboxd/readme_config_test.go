package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// readmeConfig is the config file the README's Configuration section shows,
// between its readme-config markers.
func readmeConfig(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- readme-config -->\n```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```\n<!-- /readme-config -->")
	if !ok || !ok2 {
		t.Fatal("README.md has no readme-config block")
	}
	return block
}

// README, "Configuration": the config file it shows (two indexes, two
// destinations, secrets from the environment) passes outboxd check, and a
// relay started from it indexes both indexes' documents and delivers to
// both destinations. The test changes only what must differ here: its own
// schema, index names and admin port.
func TestReadmeConfigFileRunsARelay(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	esURL := schematest.ElasticsearchURL(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE "`+e.schema+`".orders (id bigint PRIMARY KEY, cancelled bool NOT NULL);
		INSERT INTO "`+e.schema+`".orders VALUES (1, false)`); err != nil {
		t.Fatal(err)
	}
	tutorials, authors := e.schema+"-tutorials", e.schema+"-authors"
	estest.DropAll(t, tooltest.Client(t), tutorials+"-*", authors+"-*")
	text := readmeConfig(t)
	for old, repl := range map[string]string{
		"schema: outbox":                "schema: " + e.schema,
		"FROM orders":                   `FROM "` + e.schema + `".orders`,
		"127.0.0.1:9464":                "127.0.0.1:0",
		"indexes: [tutorials, authors]": "indexes: [" + tutorials + ", " + authors + "]",
	} {
		if !strings.Contains(text, old) {
			t.Fatalf("the README's config has no %q", old)
		}
		text = strings.ReplaceAll(text, old, repl)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "outboxd.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := `{"settings":{"number_of_shards":1,"number_of_replicas":0},"mappings":{"properties":{"title":{"type":"text"}}}}`
	if err := os.WriteFile(filepath.Join(dir, "index-spec.json"), []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}

	var billing, mailer atomic.Int64
	receiver := func(n *atomic.Int64) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			n.Add(1)
			w.WriteHeader(http.StatusNoContent)
		}))
		t.Cleanup(s.Close)
		return s
	}
	billingURL, mailerURL := receiver(&billing).URL, receiver(&mailer).URL
	env := secretEnviron()
	env = append(env, "DATABASE_URL="+schematest.DatabaseURL(t), "ELASTICSEARCH_URL="+esURL,
		"OUTBOXD_ADMIN_TOKEN=sEcret-readme-admin",
		"BILLING_URL="+billingURL, "BILLING_SECRET=whsec_c2VjcmV0LXJlYWRtZS1iaWxsaW5n",
		"MAILER_URL="+mailerURL, "MAILER_SECRET=sEcret-readme-mailer")
	// The environment's own search credentials are for the secret tests'
	// unreachable server; the README's file names none.
	var clean []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "ELASTICSEARCH_USERNAME=") && !strings.HasPrefix(kv, "ELASTICSEARCH_PASSWORD=") && !strings.HasPrefix(kv, "ELASTICSEARCH_API_KEY=") {
			clean = append(clean, kv)
		}
	}
	bin := tooltest.BuildOutboxd(t)

	t.Run("outboxd check passes on it", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, bin, "check", "--config", path)
		cmd.Env = clean
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("outboxd check: %v\n%s", err, out)
		}
		for _, want := range []string{"destination billing", "destination mailer", "index-spec "} {
			if !strings.Contains(string(out), "ok       "+want) {
				t.Errorf("no ok line for %s:\n%s", want, out)
			}
		}
	})

	t.Run("a relay started from it serves both indexes and both destinations", func(t *testing.T) {
		cmd := exec.Command(bin, "relay", "--config", path)
		cmd.Env = clean
		var logs strings.Builder
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		stopped := false
		defer func() {
			if !stopped {
				_ = cmd.Process.Kill()
				<-done
			}
		}()
		for _, ev := range []outbox.Event{
			{IndexName: tutorials, SourceID: "t1", Op: outbox.OpUpsert, Document: json.RawMessage(`{"title":"Indexes"}`)},
			{IndexName: authors, SourceID: "a1", Op: outbox.OpUpsert, Document: json.RawMessage(`{"title":"Ada"}`)},
		} {
			if _, err := e.outbox.Append(ctx, e.pool, ev); err != nil {
				t.Fatal(err)
			}
		}
		for _, dest := range []string{"billing", "mailer"} {
			if _, err := e.outbox.AppendMessage(ctx, e.pool, outbox.Message{Destination: dest, DedupeKey: "order-1", Payload: json.RawMessage(`{"order":"1"}`)}); err != nil {
				t.Fatal(err)
			}
		}
		found := func(index, id string) bool {
			resp, err := http.Get(strings.TrimSuffix(esURL, "/") + "/" + index + "/_doc/" + id)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}
		deadline := time.Now().Add(60 * time.Second)
		for !(found(tutorials, "t1") && found(authors, "a1") && billing.Load() == 1 && mailer.Load() == 1) {
			if time.Now().After(deadline) {
				t.Fatalf("after 60s: tutorials %v, authors %v, billing %d requests, mailer %d; relay log:\n%s",
					found(tutorials, "t1"), found(authors, "a1"), billing.Load(), mailer.Load(), logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			stopped = true
			if err != nil {
				t.Fatalf("relay exit: %v\n%s", err, logs.String())
			}
		case <-time.After(45 * time.Second):
			t.Fatalf("the relay did not stop within 45s of SIGTERM:\n%s", logs.String())
		}
		if strings.Contains(logs.String(), "sEcret") || strings.Contains(logs.String(), "c2VjcmV0LXJlYWRtZS1iaWxsaW5n") {
			t.Errorf("the relay printed a secret:\n%s", logs.String())
		}
	})
}
