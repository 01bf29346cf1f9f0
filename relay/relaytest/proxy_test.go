package relaytest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lineServer answers every line with "echo: line" and keeps what it got.
type lineServer struct {
	ln   net.Listener
	mu   sync.Mutex
	got  []string
	wg   sync.WaitGroup
	open sync.Map
}

func newLineServer(t *testing.T) *lineServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &lineServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.open.Store(c, true)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					s.mu.Lock()
					s.got = append(s.got, sc.Text())
					s.mu.Unlock()
					if _, err := io.WriteString(c, "echo: "+sc.Text()+"\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.open.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		s.wg.Wait()
	})
	return s
}

func (s *lineServer) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

func roundTrip(t *testing.T, c net.Conn, line string) {
	t.Helper()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != "echo: "+line+"\n" {
		t.Fatalf("answer to %q: %q, %v", line, got, err)
	}
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestProxy(t *testing.T) {
	t.Parallel()

	t.Run("a cut port refuses connections until it is restored", func(t *testing.T) {
		t.Parallel()
		s := newLineServer(t)
		p := NewProxy(t, s.ln.Addr().String())
		open := dial(t, p)
		roundTrip(t, open, "before")
		restore := p.Cut()
		if _, err := net.Dial("tcp", p.Addr()); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dialing a cut proxy: %v, want connection refused", err)
		}
		_ = open.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := open.Read(make([]byte, 1)); err == nil {
			t.Fatal("a connection open before the cut still reads")
		}
		restore()
		roundTrip(t, dial(t, p), "after")
	})

	t.Run("a stall holds what clients send and drops it, never forwarding it", func(t *testing.T) {
		t.Parallel()
		s := newLineServer(t)
		p := NewProxy(t, s.ln.Addr().String())
		idle, busy := dial(t, p), dial(t, p)
		roundTrip(t, idle, "idle before")
		roundTrip(t, busy, "busy before")
		held, end := p.Stall()
		if _, err := io.WriteString(busy, "held\n"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-held:
		case <-time.After(10 * time.Second):
			t.Fatal("the stall never reported a held request")
		}
		end()
		_ = busy.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := busy.Read(make([]byte, 1)); err == nil {
			t.Fatal("a connection whose request was held still reads after the stall")
		}
		roundTrip(t, idle, "idle after")
		roundTrip(t, dial(t, p), "new after")
		for _, l := range s.lines() {
			if l == "held" {
				t.Fatalf("the server got the held request: %q", s.lines())
			}
		}
	})
}
