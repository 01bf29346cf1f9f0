package webhook

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// closedByPeer is a socket whose receiver closes it, idle, after the
// first request: the next write fails with nothing sent, as a kernel
// refuses a write on a connection it saw reset.
type closedByPeer struct {
	net.Conn
	writes atomic.Int32
}

func (c *closedByPeer) Write(p []byte) (int, error) {
	if c.writes.Add(1) > 1 {
		_ = c.Conn.Close()
		return 0, syscall.ECONNRESET
	}
	return c.Conn.Write(p)
}

// TestKeepAliveRace: a kept-alive connection the receiver closed while it
// was idle fails the next request before any byte leaves. That request
// was not processed: it is sent again (on a fresh connection), never
// turned into an unknown outcome; a receiver that reads the request and
// then drops the connection still ends unknown (TestAnswerAfterEffect).
func TestKeepAliveRace(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	effects := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		effects[r.Header.Get(HeaderID)]++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	d := Destination{Name: "hook", URL: srv.URL, Secret: []byte("0123456789abcdef0123456789abcdef"), Timeout: 5 * time.Second}
	d.setDefaults()
	s := &Sink{dest: d, now: time.Now, client: newClientOver(d, func(c net.Conn) net.Conn { return &closedByPeer{Conn: c} })}
	ctx := context.Background()
	if a := s.post(ctx, "first", []byte(`{}`)); a.verdict != vDelivered {
		t.Fatalf("first request: %s %s", resultNames[a.verdict], a.reason)
	}
	a := s.post(ctx, "second", []byte(`{}`))
	if a.verdict != vRetry {
		t.Fatalf("a request on a connection the receiver had closed, nothing sent: %s (%s), want retry", resultNames[a.verdict], a.reason)
	}
	if a := s.post(ctx, "second", []byte(`{}`)); a.verdict != vDelivered {
		t.Fatalf("sent again: %s %s", resultNames[a.verdict], a.reason)
	}
	mu.Lock()
	defer mu.Unlock()
	if effects["first"] != 1 || effects["second"] != 1 {
		t.Fatalf("effects %v, want one each", effects)
	}
}
