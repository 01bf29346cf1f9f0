package main

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// Secrets the check tests put in the environment, which the config file
// names; none may appear in any output.
const (
	checkBillingSecret = "whsec_c2VjcmV0LWJpbGxpbmctbmV2ZXItcHJpbnRlZA=="
	checkMailerSecret  = "sEcret-mailer-raw-bytes"
	checkAdminToken    = "sEcret-check-admin-token"
	checkURLToken      = "tok3n-sEcret-in-path-9876"
)

// checkCase is one configuration the check tests write; the zero value
// of each field is the good one.
type checkCase struct {
	spec      string // the --index-spec file's contents
	check     string // mailer's check SQL
	billEnv   string // billing's secret_env
	searchURL string
}

// checkSetup is a schema with the table the good check reads, the
// environment the config file takes its secrets from, and the database
// password put in the URL (the test servers trust loopback, so any
// password connects; one that is already there stays).
type checkSetup struct {
	e      *cliEnv
	env    map[string]string
	dbPass string
}

func newCheckSetup(t *testing.T) *checkSetup {
	t.Helper()
	e := cliSetup(t)
	schematest.ElasticsearchURL(t)
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE "`+e.schema+`".orders (id bigint PRIMARY KEY, cancelled bool NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(schematest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pass, ok := u.User.Password()
	if !ok {
		pass = "sEcret-check-pg-password"
		u.User = url.UserPassword(u.User.Username(), pass)
	}
	return &checkSetup{e: e, dbPass: pass, env: map[string]string{
		"CHECK_DATABASE_URL":   u.String(),
		"CHECK_BILLING_SECRET": checkBillingSecret,
		"CHECK_MAILER_SECRET":  checkMailerSecret,
		"CHECK_ADMIN_TOKEN":    checkAdminToken,
	}}
}

func (s *checkSetup) secrets() []string {
	return []string{s.dbPass, checkBillingSecret, checkMailerSecret, checkAdminToken, checkURLToken}
}

// config writes the config file of c, in the layout of docs/deploy/outboxd.yaml.
func (s *checkSetup) config(t *testing.T, c checkCase) string {
	t.Helper()
	dir := t.TempDir()
	if c.spec == "" {
		c.spec = `{"settings":{"number_of_shards":1},"mappings":{"properties":{"title":{"type":"text"}}}}`
	}
	if c.check == "" {
		c.check = `SELECT NOT cancelled FROM "` + s.e.schema + `".orders WHERE id = ($2::jsonb->>'order')::bigint AND $1 <> ''`
	}
	if c.billEnv == "" {
		c.billEnv = "CHECK_BILLING_SECRET"
	}
	if c.searchURL == "" {
		c.searchURL = schematest.ElasticsearchURL(t)
	}
	if err := os.WriteFile(filepath.Join(dir, "spec.json"), []byte(c.spec), 0o600); err != nil {
		t.Fatal(err)
	}
	text := `
database:
  url: ${CHECK_DATABASE_URL}
  schema: ` + s.e.schema + `
search:
  urls: [` + c.searchURL + `]
indexing:
  index_spec: spec.json
admin:
  addr: 127.0.0.1:0
  token: ${CHECK_ADMIN_TOKEN}
destinations:
  - name: billing
    url: https://billing.internal/hooks/` + checkURLToken + `
    secret_env: ` + c.billEnv + `
    idempotent: true
  - name: mailer
    url: http://mailer.internal:8080/notify
    secret_env: CHECK_MAILER_SECRET
    check: ` + c.check + `
`
	path := filepath.Join(dir, "outboxd.yaml")
	if err := os.WriteFile(path, []byte(strings.TrimPrefix(text, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// README, "Operations": outboxd check prints one line per item, ok or
// problem, names each problem by its item and exits 1 on one; it prints
// no secret.
func TestCheckCommand(t *testing.T) {
	t.Parallel()
	s := newCheckSetup(t)
	bin := tooltest.BuildOutboxd(t)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOXD_") && !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "ELASTICSEARCH_") {
			env = append(env, kv)
		}
	}
	for k, v := range s.env {
		env = append(env, k+"="+v)
	}
	var outputs []string
	run := func(t *testing.T, path string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "check", "--config", path)
		cmd.Env = env
		out, _ := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("outboxd check did not finish:\n%s", out)
		}
		outputs = append(outputs, string(out))
		return string(out), cmd.ProcessState.ExitCode()
	}
	// problemOnly asserts that out reports exactly one problem, on the
	// line of item, with want in it, every other item ok, and exit 1.
	problemOnly := func(t *testing.T, out string, code int, item, want string) {
		t.Helper()
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		var problems []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if strings.HasPrefix(l, "problem ") {
				problems = append(problems, l)
			}
		}
		if len(problems) != 1 || !strings.HasPrefix(problems[0], "problem  "+item+": ") || !strings.Contains(problems[0], want) {
			t.Errorf("want one problem line for %s with %q, got %q:\n%s", item, want, problems, out)
		}
		if !strings.Contains(out, "outboxd check: 1 problem: "+item) {
			t.Errorf("the summary does not name %s:\n%s", item, out)
		}
	}

	t.Run("a good config passes with exit 0 and one ok line per item", func(t *testing.T) {
		out, code := run(t, s.config(t, checkCase{}))
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		want := []string{"postgres: PostgreSQL ", "schema " + s.e.schema + ": up to date", "search: ", "index-spec ", "destination billing: https://billing.internal/", "destination mailer: http://mailer.internal:8080/", "admin 127.0.0.1:0: can bind"}
		if len(lines) != len(want) {
			t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out)
		}
		for i, w := range want {
			if !strings.HasPrefix(lines[i], "ok       "+w) {
				t.Errorf("line %d = %q, want ok and %q", i+1, lines[i], w)
			}
		}
		// The product and its version, whichever server the suite runs on
		// (make test-compat runs it on OpenSearch too).
		if !strings.HasPrefix(lines[2], "ok       search: Elasticsearch ") && !strings.HasPrefix(lines[2], "ok       search: OpenSearch ") {
			t.Errorf("line 3 = %q, want the search server's product and version", lines[2])
		}
		if !strings.Contains(out, "check SQL prepared READ ONLY") || !strings.Contains(out, "accepted by the search server") {
			t.Errorf("the check SQL or the spec is not said to be checked:\n%s", out)
		}
	})
	t.Run("a broken check SQL is found by its destination's name", func(t *testing.T) {
		out, code := run(t, s.config(t, checkCase{check: `SELECT NOT cancelled FROM "` + s.e.schema + `".no_such_orders WHERE $1 <> '' AND $2::jsonb IS NOT NULL`}))
		problemOnly(t, out, code, "destination mailer", `check: PostgreSQL cannot prepare it: relation "`+s.e.schema+`.no_such_orders" does not exist`)
	})
	t.Run("a check SQL that writes is found by its destination's name", func(t *testing.T) {
		out, code := run(t, s.config(t, checkCase{check: `WITH w AS (DELETE FROM "` + s.e.schema + `".orders WHERE id = ($2::jsonb->>'order')::bigint RETURNING true) SELECT $1 <> '' FROM w`}))
		problemOnly(t, out, code, "destination mailer", "it writes (DELETE), and checks run READ ONLY")
	})
	t.Run("an index spec the server refuses is found by its file", func(t *testing.T) {
		path := s.config(t, checkCase{spec: `{"mappings":{"properties":{"title":{"type":"txet"}}}}`})
		out, code := run(t, path)
		problemOnly(t, out, code, "index-spec "+filepath.Join(filepath.Dir(path), "spec.json"), "the search server refuses it: mapper_parsing_exception: ")
		// Elasticsearch and OpenSearch word the reason differently; both
		// name the type.
		if !strings.Contains(out, "[txet]") {
			t.Errorf("the problem does not name the refused type:\n%s", out)
		}
	})
	t.Run("a missing secret is found by its destination's name and its variable", func(t *testing.T) {
		out, code := run(t, s.config(t, checkCase{billEnv: "CHECK_NO_SUCH_SECRET"}))
		problemOnly(t, out, code, "destination billing", "secret_env: environment variable CHECK_NO_SUCH_SECRET is not set")
	})
	t.Run("a search server that does not answer is a problem, and the spec is not checked", func(t *testing.T) {
		out, code := run(t, s.config(t, checkCase{searchURL: "http://127.0.0.1:1"}))
		problemOnly(t, out, code, "search", "not reached")
		if !strings.Contains(out, "skipped  index-spec ") {
			t.Errorf("the spec is not said to be skipped:\n%s", out)
		}
	})
	t.Run("no secret value is printed", func(t *testing.T) {
		for _, out := range outputs {
			for _, secret := range s.secrets() {
				if strings.Contains(out, secret) {
					t.Errorf("outboxd check printed %q:\n%s", secret, out)
				}
			}
		}
	})
}

// README, "Operations": the relay runs outboxd check's checks at start and
// refuses a problem of its configuration, naming the item as check does;
// a server that does not answer is waited for.
func TestRelayRefusesAtStartWhatCheckFinds(t *testing.T) {
	// Not parallel: it sets the environment the config file reads.
	s := newCheckSetup(t)
	for k, v := range s.env {
		t.Setenv(k, v)
	}
	streams := func(t *testing.T, e *cliEnv) int {
		t.Helper()
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".progress`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	refused := func(t *testing.T, e *cliEnv, path, want string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := runRelay(ctx, []string{"--config", path, "--schema", e.schema})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("runRelay: %v, want a refusal with %q", err, want)
		}
		if n := streams(t, e); n != 0 {
			t.Fatalf("%d streams started before the refusal", n)
		}
	}

	t.Run("a broken check SQL is refused by its destination's name", func(t *testing.T) {
		refused(t, s.e, s.config(t, checkCase{check: `SELECT NOT cancelled FROM "` + s.e.schema + `".no_such_orders WHERE $1 <> '' AND $2::jsonb IS NOT NULL`}),
			"start check: destination mailer: check: PostgreSQL cannot prepare it")
	})
	t.Run("a check SQL that writes is refused by its destination's name", func(t *testing.T) {
		refused(t, s.e, s.config(t, checkCase{check: `WITH w AS (DELETE FROM "` + s.e.schema + `".orders RETURNING true) SELECT $1 <> '' AND $2::jsonb IS NOT NULL FROM w`}),
			"start check: destination mailer: check: it writes (DELETE)")
	})
	t.Run("an index spec the server refuses is refused by its file", func(t *testing.T) {
		path := s.config(t, checkCase{spec: `{"mappings":{"properties":{"title":{"type":"txet"}}}}`})
		refused(t, s.e, path, "start check: index-spec "+filepath.Join(filepath.Dir(path), "spec.json")+": the search server refuses it: mapper_parsing_exception")
	})
	t.Run("a missing secret is refused before the relay waits for PostgreSQL", func(t *testing.T) {
		t.Setenv("CHECK_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
		refused(t, s.e, s.config(t, checkCase{billEnv: "CHECK_NO_SUCH_SECRET"}),
			"start check: destination billing: secret_env: environment variable CHECK_NO_SUCH_SECRET is not set")
	})
	t.Run("a schema with a migration not applied is refused by its name", func(t *testing.T) {
		e := cliSetup(t)
		if _, err := e.pool.Exec(context.Background(), `CREATE TABLE "`+e.schema+`".orders (id bigint, cancelled bool); DELETE FROM "`+e.schema+`".schema_migrations WHERE version = (SELECT max(version) FROM "`+e.schema+`".schema_migrations)`); err != nil {
			t.Fatal(err)
		}
		refused(t, e, s.config(t, checkCase{check: `SELECT NOT cancelled FROM "` + e.schema + `".orders WHERE $1 <> '' AND $2::jsonb IS NOT NULL`}),
			"start check: schema "+e.schema+": migrations ")
	})
	t.Run("a search server that does not answer is waited for, index spec and all", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- runRelay(ctx, []string{"--config", s.config(t, checkCase{searchURL: "http://127.0.0.1:1"}), "--lease-interval", "100ms", "--upgrade-layouts=false"})
		}()
		schematest.Eventually(t, 60*time.Second, "the relay leads its stream while the search server is away", func() bool {
			select {
			case err := <-done:
				t.Fatalf("outboxd relay exited: %v", err)
			default:
			}
			ls, err := relay.Leaders(context.Background(), s.e.pool, s.e.schema, []string{"default"})
			return err == nil && ls[0].PID != 0
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("outboxd relay: %v", err)
		}
	})
}
