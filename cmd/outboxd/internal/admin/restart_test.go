//go:build restart

// These tests restart the test PostgreSQL itself, so they run on their
// own, after the main suite (`make test` does this). They need the servers
// that scripts/services manages.

package admin_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/relay"
)

func TestRestartIdleLeader(t *testing.T) {
	e := setup(t)
	e.startRelay(t) // lease interval 100 ms
	e.startAdmin(t, admin.Config{})
	ctx := context.Background()

	t.Run("after a PostgreSQL restart an idle relay reports leader only while it holds the lock again", func(t *testing.T) {
		c := exec.Command("../../../../scripts/services", "restart-pg")
		c.Stdout, c.Stderr = os.Stderr, os.Stderr
		if err := c.Run(); err != nil {
			t.Fatalf("scripts/services restart-pg: %v", err)
		}
		for e.pool.Ping(ctx) != nil {
			time.Sleep(20 * time.Millisecond)
		}
		up := time.Now()
		var settled time.Duration
		for time.Since(up) < 3*time.Second {
			code, body, _ := e.get(t, "/readyz")
			saysLeader := code == 200 && strings.Contains(body, `"default": "leader"`)
			ls, err := relay.Leaders(ctx, e.pool, e.schema, []string{"default"})
			if err != nil {
				t.Fatal(err)
			}
			holds := ls[0].PID != 0
			switch {
			case saysLeader && holds && e.scrape(t).sum("outboxd_leader", "stream", "default") == 1:
				if settled == 0 {
					settled = time.Since(up)
				}
			case saysLeader && !holds && time.Since(up) > 300*time.Millisecond:
				t.Fatalf("%s after PostgreSQL answered, /readyz says leader although no session holds the lock: %s", time.Since(up), body)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if settled == 0 {
			t.Fatal("the relay did not lead its stream again")
		}
		t.Logf("leading again, with the lock, %s after PostgreSQL answered", settled.Round(time.Millisecond))
	})
}
