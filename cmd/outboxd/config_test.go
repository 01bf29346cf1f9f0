package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// Secrets the no-secret test puts in the environment and on the command
// line; none may appear in any output.
var testSecrets = []string{"sEcret-pg-env", "sEcret-pg-arg", "sEcret-es-url", "sEcret-es-pw", "sEcret-es-key", "sEcret-admin-env", "sEcret-admin-arg", "sEcret-api"}

// Nothing listens on port 1, so every connection fails at once.
const (
	envDatabaseURL = "postgres://alice:sEcret-pg-env@127.0.0.1:1/outboxd?sslmode=disable&connect_timeout=2"
	argDatabaseURL = "postgres://bob:sEcret-pg-arg@127.0.0.1:1/outboxd?sslmode=disable&connect_timeout=2"
)

// secretEnviron is the test's environment without outboxd's own variables,
// plus a credential in every place outboxd reads one from.
func secretEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOXD_") && !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "ELASTICSEARCH_") {
			env = append(env, kv)
		}
	}
	return append(env,
		"DATABASE_URL="+envDatabaseURL,
		"ELASTICSEARCH_URL=http://elastic:sEcret-es-url@127.0.0.1:1",
		"ELASTICSEARCH_USERNAME=elastic",
		"ELASTICSEARCH_PASSWORD=sEcret-es-pw",
		"ELASTICSEARCH_API_KEY=sEcret-es-key",
		"OUTBOXD_ADMIN_TOKEN=sEcret-admin-env",
	)
}

func TestNoOutputCarriesASecret(t *testing.T) {
	t.Parallel()
	bin := tooltest.BuildOutboxd(t)
	env := secretEnviron()
	run := func(t *testing.T, args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = env
		out, _ := cmd.CombinedOutput() // the exit code is checked by the caller
		if ctx.Err() != nil {
			t.Fatalf("outboxd %s did not finish:\n%s", strings.Join(args, " "), out)
		}
		for _, s := range testSecrets {
			if strings.Contains(string(out), s) {
				t.Errorf("outboxd %s printed %q:\n%s", strings.Join(args, " "), s, out)
			}
		}
		return string(out), cmd.ProcessState.ExitCode()
	}

	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	invocations := [][]string{{"repair", "restore"}}
	for _, n := range names {
		inv := []string{n}
		if n == "deadletters" || n == "streams" || n == "deliveries" || n == "documents" {
			inv = append(inv, "list") // these parse their flags after an action
		}
		invocations = append(invocations, inv)
	}

	for _, inv := range invocations {
		name := strings.Join(inv, " ")
		t.Run(name+" --help shows where defaults come from, not their values", func(t *testing.T) {
			out, _ := run(t, append(inv, "-h")...)
			if !strings.Contains(out, "Every flag can also be set in the environment as OUTBOXD_<FLAG>") {
				t.Errorf("the help does not come through the shared flag parser:\n%s", out)
			}
			if strings.Contains(out, "-database-url") && !strings.Contains(out, "(default $DATABASE_URL)") {
				t.Errorf("the help does not name $DATABASE_URL:\n%s", out)
			}
		})
		t.Run(name+" with an unknown flag prints usage without secrets", func(t *testing.T) {
			if out, code := run(t, append(inv, "--bogus")...); code == 0 || !strings.Contains(out, "bogus") {
				t.Errorf("exit %d:\n%s", code, out)
			}
		})
		t.Run(name+" with secrets on the command line and an unknown flag prints none", func(t *testing.T) {
			run(t, append(inv, "--database-url", argDatabaseURL, "--admin-token", "sEcret-admin-arg", "--bogus")...)
		})
	}

	// Every command that connects, against servers that are not there.
	backup := filepath.Join(t.TempDir(), "backup.ndjson")
	if err := os.WriteFile(backup, []byte(`{"index":"x","_id":"1","_version":1,"_source":{}}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"relay", "--database-url", argDatabaseURL, "--admin-token", "sEcret-admin-arg", "--admin-addr", ""},
		{"relay", "--admin-addr", ""},
		{"migrate"},
		{"check", "--admin-token", "sEcret-admin-arg", "--destination", "hook=https://hooks.internal/sEcret-api,secret_env=OUTBOXD_ADMIN_TOKEN"},
		{"status"},
		{"deadletters", "list"},
		{"reconcile", "--index", "x", "--source-sql", "SELECT 1"},
		{"repair", "--index", "x"},
		{"repair", "restore", backup},
		{"purge-tombstones", "--index", "x"},
	} {
		if args[0] == "relay" {
			// The relay does not exit for a database it cannot reach: it
			// retries. Its output up to the third retry, and its shutdown,
			// carry no secret either.
			t.Run(strings.Join(args, " ")+" retries against unreachable servers without printing a secret", func(t *testing.T) {
				out := runUntilRetried(t, bin, env, args...)
				for _, s := range testSecrets {
					if strings.Contains(out, s) {
						t.Errorf("outboxd %s printed %q:\n%s", strings.Join(args, " "), s, out)
					}
				}
			})
			continue
		}
		t.Run(strings.Join(args, " ")+" fails against unreachable servers without printing a secret", func(t *testing.T) {
			if out, code := run(t, args...); code == 0 {
				t.Errorf("exit 0:\n%s", out)
			}
		})
	}
}

func TestFlagPrecedence(t *testing.T) {
	// Not parallel: it sets the environment.
	timeout := func(t *testing.T, args ...string) time.Duration {
		t.Helper()
		fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		es := addESFlags(fs)
		if err := parseFlags(fs, args); err != nil {
			t.Fatal(err)
		}
		c, err := es.config()
		if err != nil {
			t.Fatal(err)
		}
		return c.Timeout
	}
	t.Run("--elasticsearch-timeout on the command line wins over ELASTICSEARCH_TIMEOUT", func(t *testing.T) {
		t.Setenv("ELASTICSEARCH_TIMEOUT", "60s")
		if got := timeout(t, "--elasticsearch-timeout", "5s"); got != 5*time.Second {
			t.Fatalf("timeout %v, want 5s", got)
		}
	})
	t.Run("ELASTICSEARCH_TIMEOUT applies when the command line is silent", func(t *testing.T) {
		t.Setenv("ELASTICSEARCH_TIMEOUT", "60s")
		if got := timeout(t); got != time.Minute {
			t.Fatalf("timeout %v, want 60s", got)
		}
	})
	t.Run("OUTBOXD_ELASTICSEARCH_TIMEOUT wins over ELASTICSEARCH_TIMEOUT", func(t *testing.T) {
		t.Setenv("ELASTICSEARCH_TIMEOUT", "60s")
		t.Setenv("OUTBOXD_ELASTICSEARCH_TIMEOUT", "7s")
		if got := timeout(t); got != 7*time.Second {
			t.Fatalf("timeout %v, want 7s", got)
		}
	})
	t.Run("a bad ELASTICSEARCH_TIMEOUT is refused naming the variable", func(t *testing.T) {
		t.Setenv("ELASTICSEARCH_TIMEOUT", "soon")
		fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
		addESFlags(fs)
		if err := parseFlags(fs, nil); err == nil || !strings.Contains(err.Error(), "ELASTICSEARCH_TIMEOUT") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("OUTBOXD_<FLAG> sets a flag of purge-tombstones", func(t *testing.T) {
		t.Setenv("OUTBOXD_HORIZON", "1s")
		if err := runPurge(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "horizon: 1s is too short") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("OUTBOXD_<FLAG> sets status's flags, DATABASE_URL's alias included", func(t *testing.T) {
		e := cliSetup(t)
		url := schematest.DatabaseURL(t)
		t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
		t.Setenv("OUTBOXD_DATABASE_URL", url)
		t.Setenv("OUTBOXD_SCHEMA", e.schema)
		t.Setenv("OUTBOXD_JSON", "true")
		t.Setenv("OUTBOXD_MAX_AGE", "0")
		var out bytes.Buffer
		if err := status(context.Background(), nil, &out); err != nil {
			t.Fatalf("status: %v\n%s", err, out.String())
		}
		var rep statusReport
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.MaxAge != 0 || !rep.OK {
			t.Fatalf("not the JSON report of a threshold-less status (%v):\n%s", err, out.String())
		}
	})
}

func TestRelayLingerFlag(t *testing.T) {
	// Not parallel: it sets the environment.
	linger := func(t *testing.T, args ...string) time.Duration {
		t.Helper()
		_, _, f, err := parseRelayFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		return lingerOf(f.linger)
	}
	if got := linger(t); got != 60*time.Millisecond {
		t.Errorf("default linger %v, want 60ms", got)
	}
	t.Setenv("OUTBOXD_LINGER", "250ms")
	if got := linger(t); got != 250*time.Millisecond {
		t.Errorf("OUTBOXD_LINGER=250ms gave %v", got)
	}
	// relay.Config takes zero for its default: 0 must turn it off.
	if got := linger(t, "--linger", "0"); got >= 0 {
		t.Errorf("--linger 0 gave %v, want the linger off (negative)", got)
	}
	if _, _, _, err := parseRelayFlags([]string{"--linger", "-1s"}); err == nil {
		t.Error("--linger -1s accepted")
	}
}

// runUntilRetried runs outboxd until it has logged its third retry of the
// database connection, then stops it with SIGTERM and returns all it
// printed.
func runUntilRetried(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-done
		}
	})
	schematest.Eventually(t, 60*time.Second, "the relay retries its database connection three times", func() bool {
		return strings.Contains(out.String(), "failures=3")
	})
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		stopped = true
	case <-time.After(30 * time.Second):
		t.Errorf("outboxd %s did not stop within 30s of SIGTERM", strings.Join(args, " "))
	}
	return out.String()
}
