package relay_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema/schematest"
)

// gate is a TCP proxy to PostgreSQL for one relay: shut, it ends every
// session through it at once and refuses new ones (what a failover or a
// lost network does to that relay); opened again, the relay reconnects.
// Several gates let a test bring relays back one by one.
type gate struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	shut  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// newGate starts an open gate and returns it with a pool whose
// connections all go through it.
func newGate(t *testing.T) (*gate, *pgxpool.Pool) {
	t.Helper()
	u, err := url.Parse(schematest.DatabaseURL(t))
	if err != nil {
		t.Fatalf("DATABASE_URL: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, upstream: u.Host, conns: map[net.Conn]struct{}{}}
	g.wg.Add(1)
	go g.serve()
	t.Cleanup(g.close)
	u.Host = ln.Addr().String()
	pool, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return g, pool
}

func (g *gate) serve() {
	defer g.wg.Done()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.mu.Lock()
		shut := g.shut
		g.mu.Unlock()
		if shut {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", g.upstream)
		if err != nil {
			c.Close()
			continue
		}
		g.mu.Lock()
		if g.shut {
			g.mu.Unlock()
			c.Close()
			s.Close()
			continue
		}
		g.conns[c], g.conns[s] = struct{}{}, struct{}{}
		g.mu.Unlock()
		g.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer g.wg.Done()
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			g.mu.Lock()
			delete(g.conns, dst)
			delete(g.conns, src)
			g.mu.Unlock()
		}
		go pipe(c, s)
		go pipe(s, c)
	}
}

// cut ends every session through the gate and refuses new ones until open.
func (g *gate) cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut = true
	for c := range g.conns {
		c.Close()
	}
}

func (g *gate) open() {
	g.mu.Lock()
	g.shut = false
	g.mu.Unlock()
}

func (g *gate) close() {
	g.ln.Close()
	g.cut()
	g.wg.Wait()
}
