package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestRunDemo(t *testing.T) {
	t.Parallel()

	t.Run("the scripted client sees search converge once events are delivered, and an author rename reach the cards", func(t *testing.T) {
		t.Parallel()
		env := setupCards(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// A stand-in for the relay: redeliver the whole outbox every 200ms,
		// through the documents sink as the relay does (refreshes become
		// the cards their definition returns now). Redelivery is harmless,
		// which is the point of the versioned sink.
		pumped := make(chan struct{})
		go func() {
			defer close(pumped)
			for ctx.Err() == nil {
				events, err := env.readEvents(ctx)
				if err == nil && len(events) > 0 {
					_, err = env.docs.Write(ctx, events)
				}
				if err != nil && ctx.Err() == nil {
					t.Errorf("pump: %v", err)
					return
				}
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
		var out bytes.Buffer
		err := RunDemo(ctx, DemoOptions{BaseURL: env.ts.URL, Out: &out, Count: 8, Burst: 10, Wait: time.Minute})
		cancel()
		<-pumped
		if err != nil {
			t.Fatalf("demo: %v\n%s", err, out.String())
		}
		for _, want := range []string{"created 8 tutorials", "search converged: 6 documents", "(edited)", "outboxd_idempotency_key_hits_total",
			"named author demo-user", "author rename reached all 6 of this run's tutorials in the cards index"} {
			if !strings.Contains(out.String(), want) {
				t.Fatalf("demo output lacks %q:\n%s", want, out.String())
			}
		}
		if rows := env.rows(t); rows != 9 {
			t.Fatalf("want 9 tutorials (8 and the burst's one), got %d", rows)
		}
	})
}
