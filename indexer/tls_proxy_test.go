package indexer

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
)

// The timeout tests are only as good as the hanging proxy: a proxy that
// ever answers a held request would let a Ping "succeed" against a node
// that is supposed to be wedged. So it must never answer, whatever the
// client does while it waits.
func TestTLSProxyThatHangsNeverAnswers(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	anyone := func(*http.Request) bool { return true }

	t.Run("an HTTP client gets no response, only its own timeout", func(t *testing.T) {
		t.Parallel()
		p := newTLSProxy(t, ca, anyone)
		p.hang.Store(true)
		c := &http.Client{
			Timeout:   300 * time.Millisecond,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool}},
		}
		t.Cleanup(c.CloseIdleConnections)
		res, err := c.Get(p.URL + "/")
		if err == nil {
			res.Body.Close()
			t.Fatalf("GET of a hanging proxy answered %s, want no answer", res.Status)
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("GET of a hanging proxy: %v, want the client's timeout", err)
		}
	})

	// A client that half-closes after its request (TLS close_notify) ends
	// the held request's context while the connection can still carry an
	// answer: a handler that merely returned then would have net/http
	// send an empty 200.
	t.Run("a client that closes its side after the request reads no response, only the close", func(t *testing.T) {
		t.Parallel()
		p := newTLSProxy(t, ca, anyone)
		p.hang.Store(true)
		conn, err := tls.Dial("tcp", p.URL[len("https://"):], &tls.Config{RootCAs: ca.pool})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		schematest.Eventually(t, 10*time.Second, "the proxy holds the request", func() bool { return p.hung.Load() > 0 })
		if err := conn.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(bufio.NewReader(conn))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the proxy neither answered nor closed within 10s after the client's close")
		}
		if len(got) > 0 {
			t.Fatalf("the hanging proxy answered %q, want nothing", got)
		}
	})
}
