package main

import (
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A destination's stream sends each message on its own, so its pages do
// not linger; the unrouted stream reads small pages.
func TestMessageStreams(t *testing.T) {
	// Not parallel: it sets the destination's secret in the environment.
	e := cliSetup(t)
	t.Setenv("OUTBOXD_TEST_HOOK_SECRET", "s3cret-value")
	streams, err := messageStreams(e.pool, e.schema, []string{"hook=http://127.0.0.1:9/,secret_env=OUTBOXD_TEST_HOOK_SECRET"}, 0, 1<<20, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if len(streams) != 2 {
		t.Fatalf("%d streams, want the destination's and the unrouted one", len(streams))
	}
	if s := streams[0]; s.Name != "webhook-hook" || !s.NoLinger {
		t.Errorf("destination stream %q: NoLinger %v, want true", s.Name, s.NoLinger)
	}
	if s := streams[1]; s.Name != "webhook-unrouted" || s.NoLinger || s.MaxBatchBytes != 1<<20 {
		t.Errorf("unrouted stream %q: NoLinger %v, MaxBatchBytes %d; want false and 1 MiB", s.Name, s.NoLinger, s.MaxBatchBytes)
	}
}
