package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// asCommand makes this test binary the outboxd command (main with the
// arguments after "--"), so tests can run it as a separate process and
// signal it like an operator or a supervisor would.
const asCommand = "OUTBOXD_TEST_AS_COMMAND"

func TestMain(m *testing.M) {
	if os.Getenv(asCommand) != "" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"outboxd"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	// A relay started by these tests must not upgrade the layouts of the
	// indexes other tests build on the shared Elasticsearch on purpose;
	// TestRelayUpgradesLayoutsAtStart turns it on for its own index.
	os.Setenv("OUTBOXD_UPGRADE_LAYOUTS", "false")
	os.Exit(m.Run())
}

// startCommand starts `outboxd args...` as a process; it is killed when
// the test ends if it is still running.
func startCommand(t *testing.T, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	// A -race build otherwise sleeps 1s at exit, which is not the relay's.
	cmd.Env = append(os.Environ(), asCommand+"=1", "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, out
}

// exitsWithin sends SIGTERM and fails unless the process exits with status
// 0 within limit.
func exitsWithin(t *testing.T, cmd *exec.Cmd, out *syncBuffer, limit time.Duration) {
	t.Helper()
	exited := make(chan error, 1)
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		took := time.Since(start)
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
		}
		if took >= limit {
			t.Fatalf("exited %v after SIGTERM, want under %v\n%s", took, limit, out.String())
		}
		t.Logf("exited %v after SIGTERM", took.Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15s after SIGTERM\n%s", out.String())
	}
}

// README, "Shutdown": an idle relay exits within 1s of SIGTERM, with
// status 0, whatever else is connected to it.
func TestRelayExitsPromptlyOnSIGTERM(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	esURL := schematest.ElasticsearchURL(t)
	base := append([]string{"relay", "--elasticsearch-url", esURL, "--lease-interval", "100ms"}, e.dbArgs...)

	// idle starts the relay, waits until it leads and has stood idle for a
	// moment, then lets prepare connect to it before the signal.
	idle := func(t *testing.T, args []string, prepare func()) {
		cmd, out := startCommand(t, append(base, args...)...)
		schematest.Eventually(t, 20*time.Second, "the relay leads the stream", func() bool {
			l, err := relay.Leaders(context.Background(), e.pool, e.schema, []string{"default"})
			return err == nil && l[0].PID != 0
		})
		time.Sleep(500 * time.Millisecond)
		if prepare != nil {
			prepare()
		}
		exitsWithin(t, cmd, out, time.Second)
	}

	// Subtests run one after another: they share the schema's stream.
	t.Run("without an admin server", func(t *testing.T) {
		idle(t, []string{"--admin-addr", ""}, nil)
	})
	t.Run("with the wake-up listener and every job scheduled", func(t *testing.T) {
		idle(t, []string{"--admin-addr", "", "--wakeup", "--retention-schedule", "@every 1s",
			"--tombstone-purge-schedule", "@every 1s", "--tombstone-horizon", "87600h", // other tests' tombstones stay
			"--deadletter-retry-schedule", "@every 1s"}, nil)
	})
	t.Run("with a dashboard connection idle between requests", func(t *testing.T) {
		addr := freeAddr(t)
		idle(t, []string{"--admin-addr", addr}, func() {
			// A keep-alive connection, as a browser leaves between polls.
			resp, err := http.Get("http://" + addr + "/api/summary")
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
		})
	})
	t.Run("with a connection that has sent no request", func(t *testing.T) {
		addr := freeAddr(t)
		idle(t, []string{"--admin-addr", addr}, func() {
			// A browser's preconnect, or a TCP health check.
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			time.Sleep(100 * time.Millisecond)
		})
	})
	t.Run("busy, within its in-flight pages plus a second, having stored what they acknowledged", func(t *testing.T) {
		const n = 30000
		index := schematest.Name("shutdown-")
		es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{esURL}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { esDo(t, es, "DELETE", "/"+indexer.FirstIndex(index)+"?ignore_unavailable=true", "") })
		if _, err := e.pool.Exec(context.Background(), `SELECT "`+e.schema+`".append($1, 'busy' || i, 1, 'upsert', jsonb_build_object('n', i))
			FROM generate_series(1, $2) i`, index, n); err != nil {
			t.Fatal(err)
		}
		backlog := e.backlog(t)
		// Small pages: the in-flight work (2 pages of 500 small documents)
		// takes Elasticsearch a fraction of a second.
		cmd, out := startCommand(t, append(base, "--admin-addr", "", "--batch-docs", "500", "--in-flight", "2", "--bulk-docs", "500")...)
		schematest.Eventually(t, 30*time.Second, "the relay delivers", func() bool { return e.backlog(t) < backlog })
		exitsWithin(t, cmd, out, 2*time.Second)
		left := e.backlog(t)
		if left == 0 {
			t.Skip("the relay delivered everything before the signal; the busy case was not exercised")
		}
		// What it stored is delivered; the rest follows with the next relay.
		cmd, out = startCommand(t, append(base, "--admin-addr", "")...)
		schematest.Eventually(t, 60*time.Second, "the next relay acknowledges the rest", func() bool { return e.backlog(t) == 0 })
		exitsWithin(t, cmd, out, 2*time.Second)
		esDo(t, es, "POST", "/"+indexer.WriteAlias(index)+"/_refresh", "")
		if b := esDo(t, es, "POST", "/"+indexer.WriteAlias(index)+"/_count", ""); !strings.Contains(string(b), fmt.Sprintf(`"count":%d`, n)) {
			t.Fatalf("index holds %s, want %d documents", b, n)
		}
		t.Logf("%d of %d events were left to the next relay", left, backlog)
	})
}
