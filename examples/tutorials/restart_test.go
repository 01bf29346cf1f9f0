//go:build restart

// These tests restart the test PostgreSQL itself, so they run on their
// own, after the main suite (`make test` does this). They need the servers
// that scripts/services manages.

package main

import (
	"os"
	"os/exec"
	"testing"
)

func TestRestartIdempotency(t *testing.T) {
	t.Run("a retry of a write cut off by a PostgreSQL restart succeeds at once with one row", func(t *testing.T) {
		env := setup(t)
		cutOffWrite(t, env, func(int) {
			c := exec.Command("../../scripts/services", "restart-pg")
			c.Stdout, c.Stderr = os.Stderr, os.Stderr
			if err := c.Run(); err != nil {
				t.Fatalf("scripts/services restart-pg: %v", err)
			}
		})
	})
}
