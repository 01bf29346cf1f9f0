package main

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// refusingProxy forwards to PostgreSQL but cuts the first refuse
// connections at once, as a server that is restarting or a network that
// drops the relay's first sessions.
type refusingProxy struct {
	ln       net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
}

func newRefusingProxy(t *testing.T, upstream string, refuse int64) *refusingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &refusingProxy{ln: ln}
	var mu sync.Mutex
	var conns []net.Conn
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if p.accepted.Add(1) <= refuse {
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(s, c); s.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func TestRelayWaitsForPostgreSQLAtStart(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	schematest.ElasticsearchURL(t)
	u, err := url.Parse(schematest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	const refused = 3
	proxy := newRefusingProxy(t, u.Host, refused)
	u.Host = proxy.ln.Addr().String()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- runRelay(ctx, []string{"--database-url", u.String(), "--schema", e.schema, "--admin-addr", "", "--lease-interval", "100ms", "--upgrade-layouts=false"})
	}()
	schematest.Eventually(t, 60*time.Second, "the relay leads its stream after the refused connections", func() bool {
		select {
		case err := <-done:
			t.Fatalf("outboxd relay exited after %d refused connections: %v", proxy.accepted.Load(), err)
		default:
		}
		ls, err := relay.Leaders(context.Background(), e.pool, e.schema, []string{"default"})
		return err == nil && ls[0].PID != 0
	})
	if n := proxy.accepted.Load(); n <= refused {
		t.Fatalf("only %d connections were made", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("outboxd relay: %v", err)
	}
}
