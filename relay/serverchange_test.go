package relay_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// syncBuffer is a log destination the relay's goroutines share.
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

// A failover to a standby without the old primary's newest transactions
// leaves a leader holding, in memory, a position the new server's
// transaction counter is behind. That is no reason to stop: the leader
// gives the stream up and leads it again from the position stored on the
// server it now reaches, and every event is delivered. (A stored position
// ahead of the counter, a restore, still stops the stream: see
// TestRelayFailures.)
func TestLeaderReadingFromAnotherServerLeadsAgainFromTheStoredPosition(t *testing.T) {
	t.Parallel()
	e := setup(t)
	sink := newRecordingSink()
	cfg := e.config(sink)
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	relay.MoveReadPositionAfterFirstPage(&cfg, 1<<32)
	ids := e.append(t, 50)
	stop := start(t, cfg)
	schematest.Eventually(t, 60*time.Second, "the first 50 events delivered", func() bool { return sink.delivered() == len(ids) })
	more := e.append(t, 50)
	schematest.Eventually(t, 60*time.Second, "the next 50 events delivered", func() bool { return sink.delivered() == len(ids)+len(more) })
	schematest.Eventually(t, 60*time.Second, "backlog zero", func() bool { return e.backlog(t) == 0 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "another server (a promoted standby?) answers now") {
		t.Errorf("the leader did not say why it led the stream again:\n%s", logs.String())
	}
}
