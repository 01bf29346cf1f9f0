package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// syncBuffer collects log output written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// README, "Configuration": every relay flag can be set as OUTBOXD_<FLAG>
// (dashes as underscores) and the command line wins; a bad value is refused
// naming the variable.
func TestGuaranteeFlagsFromEnvironment(t *testing.T) {
	// Not parallel: it sets the environment.
	newFS := func() (*flag.FlagSet, *string, *int, *time.Duration) {
		fs := flag.NewFlagSet("relay", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		addr := fs.String("admin-addr", admin.DefaultAddr, "")
		attempts := fs.Int("max-attempts", 10, "")
		lease := fs.Duration("lease-interval", time.Second, "")
		return fs, addr, attempts, lease
	}
	t.Setenv("OUTBOXD_ADMIN_ADDR", "127.0.0.1:7001")
	t.Setenv("OUTBOXD_MAX_ATTEMPTS", "4")
	t.Setenv("OUTBOXD_LEASE_INTERVAL", "250ms")

	fs, addr, attempts, lease := newFS()
	if err := parseFlags(fs, nil); err != nil {
		t.Fatal(err)
	}
	if *addr != "127.0.0.1:7001" || *attempts != 4 || *lease != 250*time.Millisecond {
		t.Fatalf("from the environment: admin-addr %q, max-attempts %d, lease-interval %v", *addr, *attempts, *lease)
	}

	fs, addr, attempts, lease = newFS()
	if err := parseFlags(fs, []string{"--admin-addr", "127.0.0.1:7002", "--max-attempts=6"}); err != nil {
		t.Fatal(err)
	}
	if *addr != "127.0.0.1:7002" || *attempts != 6 || *lease != 250*time.Millisecond {
		t.Fatalf("the command line must win: admin-addr %q, max-attempts %d, lease-interval %v", *addr, *attempts, *lease)
	}

	t.Setenv("OUTBOXD_MAX_ATTEMPTS", "many")
	fs, _, _, _ = newFS()
	if err := parseFlags(fs, nil); err == nil || !strings.Contains(err.Error(), "OUTBOXD_MAX_ATTEMPTS") {
		t.Fatalf("a bad environment value: err = %v", err)
	}
}

// README, "Configuration": secrets are never logged. The PostgreSQL URL's
// password must not appear in connection or parse errors (they are printed).
func TestGuaranteeDatabaseErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"postgres://alice:pg-secret-pw@127.0.0.1:1/outboxd?sslmode=disable&connect_timeout=2", // nothing listens
		"postgres://alice:pg-secret-pw@127.0.0.1:notaport/outboxd",                            // unparseable
		"host=127.0.0.1 port=1 user=alice password=pg-secret-pw connect_timeout=2 sslmode=disable",
	} {
		f := &dbFlags{url: url, schema: "outbox"}
		pool, err := f.pool(context.Background())
		if err == nil {
			pool.Close()
			t.Fatalf("%s: connected", url)
		}
		if strings.Contains(err.Error(), "pg-secret-pw") {
			t.Fatalf("the error echoes the password: %v", err)
		}
	}
}

// README, "Operations"/"Configuration": the admin server binds to loopback
// (127.0.0.1:9464) by default.
func TestGuaranteeAdminLoopbackByDefault(t *testing.T) {
	// Not parallel: it swaps os.Stderr to read the relay's --help.
	host, port, err := net.SplitHostPort(admin.DefaultAddr)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() || port != "9464" {
		t.Fatalf("admin.DefaultAddr = %q, want a loopback address on 9464", admin.DefaultAddr)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	runErr := runRelay(context.Background(), []string{"--help"})
	os.Stderr = stderr
	_ = w.Close()
	help, _ := io.ReadAll(r)
	if !errors.Is(runErr, flag.ErrHelp) {
		t.Fatalf("relay --help: %v", runErr)
	}
	i := strings.Index(string(help), "-admin-addr")
	if i < 0 {
		t.Fatalf("no --admin-addr in:\n%s", help)
	}
	line := string(help[i:])
	if j := strings.Index(line, "\n  -"); j >= 0 {
		line = line[:j]
	}
	if !strings.Contains(line, `(default "127.0.0.1:9464")`) {
		t.Fatalf("--admin-addr default is not loopback:\n%s", line)
	}
}

// README, "Operations": the relay's /metrics serves the outboxd_* names it
// lists; "Configuration": OUTBOXD_<FLAG> sets a relay flag and secrets are
// never logged. Runs the real `outboxd relay` command against both servers.
func TestGuaranteeRelayCommandMetricsEnvAndLogs(t *testing.T) {
	// Not parallel: it sets the environment and the default logger.
	e := cliSetup(t)
	esURL := schematest.ElasticsearchURL(t)
	index := schematest.Name("gt-")
	t.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", esURL+"/"+index+"-000001,"+index+"?ignore_unavailable=true", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})

	dbURL := strings.Replace(schematest.DatabaseURL(t), "://postgres@", "://postgres:pg-secret-pw@", 1)
	if !strings.Contains(dbURL, "pg-secret-pw") {
		t.Skipf("DATABASE_URL %q has no user to add a password to", schematest.DatabaseURL(t))
	}
	addr := freeAddr(t)
	t.Setenv("DATABASE_URL", dbURL) // trust auth on loopback ignores the password
	t.Setenv("ELASTICSEARCH_URL", esURL)
	t.Setenv("ELASTICSEARCH_USERNAME", "elastic")
	t.Setenv("ELASTICSEARCH_PASSWORD", "es-secret-pw") // security is off: ignored
	t.Setenv("OUTBOXD_ADMIN_ADDR", addr)               // only via the environment
	t.Setenv("OUTBOXD_RETENTION_SCHEDULE", "@every 1s")
	t.Setenv("OUTBOXD_ADMIN_TOKEN", "")

	logs := &syncBuffer{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runRelay(ctx, []string{"--schema", e.schema, "--lease-interval", "100ms", "--max-poll", "20ms", "--store-interval", "20ms"})
	}()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(60 * time.Second):
			return fmt.Errorf("relay did not stop")
		}
	}
	t.Cleanup(func() { _ = stop() })

	const n = 5
	for i := range n {
		if _, err := e.outbox.Append(context.Background(), e.pool, outbox.Event{IndexName: index, SourceID: "s" + strconv.Itoa(i), Version: 2,
			Op: outbox.OpUpsert, Document: json.RawMessage(`{"n":1}`)}); err != nil {
			t.Fatal(err)
		}
	}
	// A replay of s0 at the same version: stale.
	if _, err := e.outbox.Append(context.Background(), e.pool, outbox.Event{IndexName: index, SourceID: "s0", Version: 2,
		Op: outbox.OpUpsert, Document: json.RawMessage(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}

	// A mapping conflict once "n" is mapped as a number: rejected, parked.
	schematest.Eventually(t, 20*time.Second, "the first events are delivered", func() bool { return e.backlog(t) == 0 })
	if _, err := e.outbox.Append(context.Background(), e.pool, outbox.Event{IndexName: index, SourceID: "bad", Version: 1,
		Op: outbox.OpUpsert, Document: json.RawMessage(`{"n":"not a number"}`)}); err != nil {
		t.Fatal(err)
	}

	scrape := func() (string, error) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return "", fmt.Errorf("/metrics: %d", resp.StatusCode)
		}
		return string(b), err
	}
	var body string
	schematest.Eventually(t, 60*time.Second, "the relay applied every event and ran the retention job (admin server on OUTBOXD_ADMIN_ADDR)", func() bool {
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("relay exited early: %v\nlogs:\n%s", err, logs.String())
		default:
		}
		b, err := scrape()
		if err != nil {
			return false
		}
		body = b
		return strings.Contains(b, `outboxd_events_total{index="`+index+`",outcome="applied",stream="default"} 5`) &&
			strings.Contains(b, `outboxd_events_total{index="`+index+`",outcome="stale",stream="default"} 1`) &&
			strings.Contains(b, `outboxd_events_total{index="`+index+`",outcome="rejected",stream="default"} 1`) &&
			strings.Contains(b, `outboxd_job_runs_total{job_name="outbox-retention"`) &&
			strings.Contains(b, `outboxd_dead_letters_parked{index="`+index+`"} 1`) &&
			strings.Contains(b, `outboxd_backlog_events{stream="default"} 0`) // the stats cache (1s) caught up
	})
	for _, name := range []string{
		"outboxd_backlog_events", "outboxd_oldest_unacked_age_seconds", "outboxd_events_total",
		"outboxd_dead_letters_parked", "outboxd_bulk_request_seconds", "outboxd_commit_to_applied_seconds",
		"outboxd_progress_xid", "outboxd_leader", "outboxd_last_cycle_timestamp_seconds", "outboxd_job_runs_total",
	} {
		if !strings.Contains(body, "\n"+name+"{") && !strings.Contains(body, "\n"+name+" ") &&
			!strings.Contains(body, "\n"+name+"_bucket{") {
			t.Errorf("/metrics has no %s", name)
		}
	}
	if !strings.Contains(body, `outboxd_leader{stream="default"} 1`) {
		t.Errorf("outboxd_leader{stream=\"default\"} is not 1")
	}
	for _, secret := range []string{"pg-secret-pw", "es-secret-pw"} {
		if strings.Contains(body, secret) {
			t.Errorf("/metrics contains the secret %q", secret)
		}
	}

	if err := stop(); err != nil {
		t.Fatalf("relay: %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, "relay starting") {
		t.Fatalf("the relay's logs were not captured:\n%s", out)
	}
	for _, secret := range []string{"pg-secret-pw", "es-secret-pw"} {
		if strings.Contains(out, secret) {
			t.Errorf("the logs contain the secret %q:\n%s", secret, out)
		}
	}
}
