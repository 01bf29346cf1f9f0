package main

import (
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
)

// README, "Configuration": an idle relay runs the scheduler on one
// processor, unless GOMAXPROCS in the environment fixes the number.
func TestRelayProcs(t *testing.T) {
	// Not parallel: one case sets the environment.
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: nothing to give back")
	}
	e := cliSetup(t)
	esURL := schematest.ElasticsearchURL(t)
	re := regexp.MustCompile(`(?m)^go_sched_gomaxprocs_threads (\S+)$`)
	procsOf := func(addr string) int {
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return -1
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		m := re.FindSubmatch(b)
		if m == nil {
			return -1
		}
		n, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			return -1
		}
		return int(n)
	}
	relay := func(t *testing.T) (addr string, out *syncBuffer, stop func()) {
		addr = freeAddr(t)
		cmd, out := startCommand(t, append([]string{"relay", "--elasticsearch-url", esURL, "--admin-addr", addr}, e.dbArgs...)...)
		schematest.Eventually(t, 20*time.Second, "the relay's /metrics", func() bool { return procsOf(addr) > 0 })
		return addr, out, func() { exitsWithin(t, cmd, out, 5*time.Second) }
	}
	t.Run("an idle relay runs on one processor", func(t *testing.T) {
		t.Setenv("GOMAXPROCS", "") // the environment's would turn it off
		t.Setenv("OUTBOXD_LOG_LEVEL", "debug")
		addr, out, stop := relay(t)
		defer stop()
		for deadline := time.Now().Add(30 * time.Second); procsOf(addr) != 1; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("GOMAXPROCS %d after 30 s of an idle relay, want 1; its log:\n%s", procsOf(addr), out.String())
			}
		}
	})
	t.Run("GOMAXPROCS in the environment wins", func(t *testing.T) {
		t.Setenv("GOMAXPROCS", "2")
		addr, _, stop := relay(t)
		defer stop()
		time.Sleep((quietSeconds + 2) * procsPeriod)
		if n := procsOf(addr); n != 2 {
			t.Fatalf("GOMAXPROCS=2 in the environment, and the relay runs on %d", n)
		}
	})
}
