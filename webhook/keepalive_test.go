package webhook_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/outboxd/outboxd/webhook"
)

// TestKeepAliveRace: a receiver that answers the first request on a
// connection and closes it when the next one arrives, unread (an idle
// keep-alive connection it had given up on). The request is tried once
// more on a fresh connection and delivered, not parked as unknown.
func TestKeepAliveRace(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	effects := map[string]int{}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				mu.Lock()
				effects[req.Header.Get("webhook-id")]++
				mu.Unlock()
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
				_, _ = br.Peek(1) // the next request on this connection: closed unanswered
			}()
		}
	}()
	s := e.sink(t, e.pool, destination("hook", "http://"+ln.Addr().String(), false), webhook.Options{})
	for _, k := range []string{"a", "b"} {
		write(t, s, message(e.send(t, "hook", k, `{}`), "hook", k, `{}`))
		d := e.delivery(t, "hook", k)
		mu.Lock()
		n := effects[k]
		mu.Unlock()
		if d.State != webhook.StateDelivered || n != 1 {
			t.Fatalf("%s: state %s (%s), %d effects; want delivered once", k, d.State, d.LastError, n)
		}
	}
}
