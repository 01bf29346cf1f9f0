package admin_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
)

// A stream left behind by a change of partitions shows as abandoned, not
// as a stream without a leader (which would mean an outage).
func TestAdminSummaryShowsAbandonedStreams(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startRelay(t)
	// The progress row an old configuration left two hours ago.
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO "`+e.schema+`".progress (stream, done_snapshot, updated_at)
		VALUES ('old-0-of-2', '1:1:', now() - interval '2 hours')`); err != nil {
		t.Fatal(err)
	}
	e.startAdmin(t, admin.Config{})

	t.Run("the summary counts it apart from streams without a leader", func(t *testing.T) {
		summaryShowsAbandoned(t, e)
	})
	t.Run("the page marks it and says how to drop it", func(t *testing.T) {
		dom := headless(t, chromium(t), e.base+"/", "--dump-dom")
		for _, want := range []string{`data-abandoned="1"`, `>abandoned streams<`, "outboxd streams drop NAME"} {
			if !strings.Contains(dom, want) {
				t.Fatalf("the page has no %s", want)
			}
		}
		if strings.Contains(dom, `id="stream-abandoned" style="display: none;"`) || strings.Contains(dom, `id="stream-abandoned" style="display:none"`) {
			t.Fatal("the note on abandoned streams is hidden")
		}
	})
}

func summaryShowsAbandoned(t *testing.T, e *testEnv) {
	t.Helper()
	code, body, _ := e.get(t, "/api/summary")
	if code != 200 {
		t.Fatalf("/api/summary: %d %s", code, body)
	}
	var sum admin.Summary
	if err := json.Unmarshal([]byte(body), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Totals.Abandoned != 1 || sum.Totals.LeaderlessLive != 0 {
		t.Fatalf("totals = %+v, want 1 abandoned and no live stream without a leader", sum.Totals)
	}
	for _, s := range sum.Streams {
		if want := s.Stream == "old-0-of-2"; s.Abandoned != want {
			t.Fatalf("stream %s: abandoned = %v, want %v", s.Stream, s.Abandoned, want)
		}
	}
}
