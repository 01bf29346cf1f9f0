package relaytest

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proxy is a TCP proxy on loopback in front of a real server, for the
// outages and stalls a harness needs without stopping the server (which
// other tests share): Cut makes its port refuse connections, Stall holds
// what the sink sends. Point the sink at Addr.
type Proxy struct {
	t      testing.TB
	target string
	addr   string

	mu      sync.Mutex
	ln      net.Listener // nil while cut
	links   map[*link]struct{}
	holding bool
	held    chan struct{} // closed once a chunk is held in this stall
	heldHit bool
	closed  bool
	wg      sync.WaitGroup
}

// link is one proxied connection. Once a chunk of it is held, nothing
// more of it is forwarded: the stream lost a piece, so it can only be
// dropped.
type link struct {
	client, server net.Conn
	poisoned       bool // guarded by Proxy.mu
}

// NewProxy starts a proxy to target (host:port) that lives until the test
// ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("relaytest: proxy: %v", err)
	}
	p := &Proxy{t: t, target: target, addr: ln.Addr().String(), ln: ln, links: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.serve(ln)
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.addr }

// Cut closes every connection and the listening socket, so that the port
// refuses connections as a stopped server's would, until restore.
func (p *Proxy) Cut() (restore func()) {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.dropLocked(func(*link) bool { return true })
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	var once sync.Once
	return func() { once.Do(p.listenAgain) }
}

// listenAgain listens on the proxy's address again. Another process may
// take a freed port only by binding it explicitly, which nothing on a
// test machine does for an ephemeral one; a short retry covers the kernel
// still holding it.
func (p *Proxy) listenAgain() {
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", p.addr)
		if err == nil {
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				_ = ln.Close()
				return
			}
			p.ln = ln
			p.wg.Add(1)
			p.mu.Unlock()
			go p.serve(ln)
			return
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			p.t.Fatalf("relaytest: proxy: listening on %s again after a cut: %v", p.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stall holds every byte the clients send from now on, on open
// connections and new ones alike, without forwarding it: the server
// never sees the requests, and the clients wait for answers that do not
// come. held is closed once something is held. end closes the
// connections that had bytes held (what they carried is lost, never
// applied) and lets every other connection, and every new one, through.
func (p *Proxy) Stall() (held <-chan struct{}, end func()) {
	p.mu.Lock()
	p.holding = true
	p.held = make(chan struct{})
	p.heldHit = false
	ch := p.held
	p.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			p.mu.Lock()
			p.holding = false
			p.dropLocked(func(l *link) bool { return l.poisoned })
			p.mu.Unlock()
		})
	}
}

func (p *Proxy) dropLocked(which func(*link) bool) {
	for l := range p.links {
		if which(l) {
			_ = l.client.Close()
			_ = l.server.Close()
			delete(p.links, l)
		}
	}
}

func (p *Proxy) serve(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by Cut or close
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

func (p *Proxy) relay(c net.Conn) {
	defer p.wg.Done()
	s, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	l := &link{client: c, server: s}
	p.mu.Lock()
	if p.closed || p.ln == nil {
		// Cut (or closed) while this connection was being set up.
		p.mu.Unlock()
		_ = c.Close()
		_ = s.Close()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		_ = c.Close()
		_ = s.Close()
	}()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = c.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 && p.forward(l) {
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// forward says whether a chunk the client sent on l goes to the server,
// or is held (and so lost).
func (p *Proxy) forward(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.holding && !l.poisoned {
		return true
	}
	if p.holding {
		l.poisoned = true
		if !p.heldHit {
			p.heldHit = true
			close(p.held)
		}
	}
	return false
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	ln := p.ln
	p.ln = nil
	p.dropLocked(func(*link) bool { return true })
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	p.wg.Wait()
}
