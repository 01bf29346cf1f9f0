package relay_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema/schematest"
)

// cutProxy sits between the relay and PostgreSQL and reads the server's
// side of every connection message by message (type byte, length, body),
// so that a test can cut one connection right after a chosen message:
// deterministically, wherever the client is in its pipeline.
type cutProxy struct {
	ln       net.Listener
	upstream string

	mu       sync.Mutex
	triggers []*trigger
	binds    []*bindTrigger
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

// trigger fires on the n-th server message that match accepts, counted
// over all connections; it then closes fired and, if cut, ends that
// connection before the client sees anything after the message.
type trigger struct {
	match func(typ byte, body []byte) bool
	n     int
	cut   bool
	seen  int
	fired chan struct{}
}

// bindTrigger fires on the n-th Bind the client sends for a statement
// whose SQL match accepts, and cuts that connection before the server
// sees the Bind: the statement never runs.
type bindTrigger struct {
	match func(sql string) bool
	n     int
	seen  int
	fired chan struct{}
}

// newCutProxy starts a proxy to DATABASE_URL's server and returns it with
// a pool whose connections all go through it.
func newCutProxy(t *testing.T) (*cutProxy, *pgxpool.Pool) {
	t.Helper()
	u, err := url.Parse(schematest.DatabaseURL(t))
	if err != nil {
		t.Fatalf("DATABASE_URL: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, upstream: u.Host, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)

	// The server's side is framed from its first byte only without TLS
	// (an SSLRequest is answered with one bare byte).
	u.Host = ln.Addr().String()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return p, pool
}

// after arms a trigger on the n-th server message match accepts and
// returns a channel closed once it fired.
func (p *cutProxy) after(n int, cut bool, match func(typ byte, body []byte) bool) <-chan struct{} {
	tr := &trigger{match: match, n: n, cut: cut, fired: make(chan struct{})}
	p.mu.Lock()
	p.triggers = append(p.triggers, tr)
	p.mu.Unlock()
	return tr.fired
}

// commandComplete matches the CommandComplete message whose tag is tag
// (e.g. "SELECT 10", "UPDATE 1").
func commandComplete(tag string) func(byte, []byte) bool {
	want := append([]byte(tag), 0)
	return func(typ byte, body []byte) bool { return typ == 'C' && bytes.Equal(body, want) }
}

func (p *cutProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			p.relayClient(c, s)
			s.Close()
			c.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.relayServer(s, c)
			s.Close()
			c.Close()
		}()
	}
}

// relayServer forwards the server's messages to the client one at a time
// and stops (cutting the connection) after one that fires a cutting trigger.
func (p *cutProxy) relayServer(s, c net.Conn) {
	var head [5]byte
	for {
		if _, err := io.ReadFull(s, head[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(head[1:])) - 4
		if n < 0 {
			return
		}
		msg := make([]byte, 5+n)
		copy(msg, head[:])
		if _, err := io.ReadFull(s, msg[5:]); err != nil {
			return
		}
		if _, err := c.Write(msg); err != nil {
			return
		}
		if p.fire(head[0], msg[5:]) {
			return
		}
	}
}

// beforeBind arms a trigger on the n-th Bind of a statement whose SQL
// match accepts and returns a channel closed once it cut the connection.
func (p *cutProxy) beforeBind(n int, match func(sql string) bool) <-chan struct{} {
	tr := &bindTrigger{match: match, n: n, fired: make(chan struct{})}
	p.mu.Lock()
	p.binds = append(p.binds, tr)
	p.mu.Unlock()
	return tr.fired
}

// relayClient forwards the client's messages to the server: the untyped
// startup message, then typed ones. It remembers each prepared statement's
// SQL (from Parse) so that a Bind can be matched by what it runs.
func (p *cutProxy) relayClient(c, s net.Conn) {
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return
	}
	startup := make([]byte, binary.BigEndian.Uint32(size[:]))
	copy(startup, size[:])
	if _, err := io.ReadFull(c, startup[4:]); err != nil {
		return
	}
	if _, err := s.Write(startup); err != nil {
		return
	}
	statements := map[string]string{}
	var head [5]byte
	for {
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(head[1:])) - 4
		if n < 0 {
			return
		}
		msg := make([]byte, 5+n)
		copy(msg, head[:])
		if _, err := io.ReadFull(c, msg[5:]); err != nil {
			return
		}
		body := msg[5:]
		switch head[0] {
		case 'P': // Parse: name, SQL, ...
			if f := bytes.SplitN(body, []byte{0}, 3); len(f) == 3 {
				statements[string(f[0])] = string(f[1])
			}
		case 'B': // Bind: portal, statement, ...
			if f := bytes.SplitN(body, []byte{0}, 3); len(f) == 3 && p.fireBind(statements[string(f[1])]) {
				return
			}
		}
		if _, err := s.Write(msg); err != nil {
			return
		}
	}
}

func (p *cutProxy) fireBind(sql string) (cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, tr := range p.binds {
		if tr.seen >= tr.n || !tr.match(sql) {
			continue
		}
		tr.seen++
		if tr.seen == tr.n {
			close(tr.fired)
			cut = true
		}
	}
	return cut
}

func (p *cutProxy) fire(typ byte, body []byte) (cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, tr := range p.triggers {
		if tr.seen >= tr.n || !tr.match(typ, body) {
			continue
		}
		tr.seen++
		if tr.seen == tr.n {
			close(tr.fired)
			cut = cut || tr.cut
		}
	}
	return cut
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}
