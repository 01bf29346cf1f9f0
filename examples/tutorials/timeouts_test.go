package main

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestServerTimeouts(t *testing.T) {
	t.Parallel()
	const readTimeout = time.Second
	e := setup(t, func(c *Config) { c.ReadTimeout = readTimeout })

	// closedWithin reads from conn until the server closes it and reports
	// how long that took and the status line of any answer.
	closedWithin := func(t *testing.T, conn net.Conn, start time.Time) (time.Duration, string) {
		t.Helper()
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		r := bufio.NewReader(conn)
		status, _ := r.ReadString('\n')
		_, err := io.Copy(io.Discard, r)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("the server still held the connection after 30s")
		}
		return time.Since(start), strings.TrimSpace(status)
	}

	t.Run("a client that dribbles its body is answered 408 and cut off within the read timeout", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", e.ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		start := time.Now()
		_, err = io.WriteString(conn, "POST /api/tutorials HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"+
			HeaderUserID+": alice\r\nIdempotency-Key: slow-1\r\nContent-Length: 10000\r\n\r\n{")
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if _, err := io.WriteString(conn, " "); err != nil {
					return
				}
			}
		}()
		took, status := closedWithin(t, conn, start)
		t.Logf("closed after %s with %q", took.Round(time.Millisecond), status)
		if !strings.Contains(status, "408") {
			t.Errorf("status line %q, want 408", status)
		}
		if bound := readTimeout + 2*time.Second; took > bound {
			t.Fatalf("the connection stayed open %s, want under %s", took, bound)
		}
		if n := e.count(t, `SELECT count(*) FROM `+e.srv.keys.table); n != 0 {
			t.Fatalf("%d idempotency keys claimed by a request whose body never arrived", n)
		}
	})

	t.Run("a client that never finishes its headers is cut off within the read timeout", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", e.ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		start := time.Now()
		if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: api\r\n"); err != nil {
			t.Fatal(err)
		}
		took, _ := closedWithin(t, conn, start)
		if bound := readTimeout + 2*time.Second; took > bound {
			t.Fatalf("the connection stayed open %s, want under %s", took, bound)
		}
	})

	t.Run("the server example-api runs sets every timeout", func(t *testing.T) {
		hs := e.srv.HTTPServer()
		if hs.ReadHeaderTimeout <= 0 || hs.ReadTimeout != readTimeout || hs.WriteTimeout <= hs.ReadTimeout || hs.IdleTimeout <= 0 {
			t.Fatalf("timeouts: read header %s, read %s, write %s, idle %s", hs.ReadHeaderTimeout, hs.ReadTimeout, hs.WriteTimeout, hs.IdleTimeout)
		}
	})
}
