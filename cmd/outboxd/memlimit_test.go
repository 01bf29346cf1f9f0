package main

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
)

// README, "Configuration": outboxd relay sets the Go runtime's soft memory
// limit from --memory-limit (auto: from the page bounds) unless GOMEMLIMIT
// sets it.
func TestRelayMemoryLimit(t *testing.T) {
	// Not parallel: one case sets the environment.
	e := cliSetup(t)
	esURL := schematest.ElasticsearchURL(t)
	limitOf := func(t *testing.T, args ...string) int64 {
		t.Helper()
		addr := freeAddr(t)
		cmd, out := startCommand(t, append(append([]string{"relay", "--elasticsearch-url", esURL, "--lease-interval", "100ms", "--admin-addr", addr}, e.dbArgs...), args...)...)
		re := regexp.MustCompile(`(?m)^go_gc_gomemlimit_bytes (\S+)$`)
		var limit int64 = -1
		schematest.Eventually(t, 20*time.Second, "the relay's /metrics", func() bool {
			res, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				return false
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			m := re.FindSubmatch(b)
			if m == nil {
				return false
			}
			f, err := strconv.ParseFloat(string(m[1]), 64)
			limit = int64(f)
			return err == nil
		})
		exitsWithin(t, cmd, out, 5*time.Second)
		return limit
	}
	t.Run("auto: 32 MiB and (prefetch + 2 x in-flight + 1) pages per stream", func(t *testing.T) {
		// Two streams: the search stream and the unrouted message stream
		// every relay runs, whose pages are at most 1 MiB.
		if got, want := limitOf(t, "--batch-bytes", "1048576"), int64(32<<20+2*(2+2*3+1)<<20); got != want {
			t.Fatalf("limit %d, want %d", got, want)
		}
		if got, want := limitOf(t, "--batch-bytes", "4194304"), int64(32<<20+(2+2*3+1)*(4<<20+1<<20)); got != want {
			t.Fatalf("limit %d, want %d (the unrouted stream's pages at 1 MiB)", got, want)
		}
	})
	t.Run("a size", func(t *testing.T) {
		if got := limitOf(t, "--memory-limit", "300MiB"); got != 300<<20 {
			t.Fatalf("limit %d, want 300 MiB", got)
		}
	})
	t.Run("GOMEMLIMIT wins", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "123MiB")
		if got := limitOf(t, "--memory-limit", "300MiB"); got != 123<<20 {
			t.Fatalf("limit %d, want GOMEMLIMIT's 123 MiB", got)
		}
	})
	t.Run("a bad size is refused before connecting", func(t *testing.T) {
		if _, _, _, err := parseRelayFlags([]string{"--memory-limit", "lots"}); err == nil {
			t.Fatal("--memory-limit lots accepted")
		}
	})
}
