package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// verdict is how one HTTP attempt ended.
type verdict int

const (
	vDelivered verdict = iota // 2xx
	vRefused                  // a permanent answer: 3xx, 4xx other than 408/429
	vRetry                    // proved not processed: not sent, 408, 429 (and 5xx with retry_5xx)
	vUncertain                // sent, then no proof either way (5xx, timeout, reset, bad answer)
)

// exchange is what one HTTP attempt showed: whether any byte of the
// request was written, the status of the answer (0: none), and the
// transport error (nil: an answer was read).
type exchange struct {
	wrote  bool
	status int
	err    error
}

// closedIdle reports net/http's "server closed idle connection": the
// receiver closed a kept-alive connection before this request was even
// registered on it (the transport saw the end of the connection while no
// answer was expected), so it cannot have read the request, whatever
// bytes reached the dead socket. net/http re-sends such a request itself
// only when it looks idempotent; outboxd knows it was not processed.
func closedIdle(err error) bool {
	return err != nil && strings.Contains(err.Error(), "http: server closed idle connection")
}

// judge is the answer rule. A request is sent again only when the answer
// proves it was not processed: it never left (connection refused, DNS,
// TLS handshake), or the receiver said 408 or 429. Every other outcome
// after the request was written may hide an effect: a 5xx (the proxy lost
// the answer, the error came after the commit), a timeout, a reset, a
// malformed answer. retry5xx is the destination owner's promise that a
// 5xx means "no effect". Idempotent destinations retry uncertain outcomes
// under the same key anyway (see Sink.deliver).
func judge(x exchange, retry5xx bool) verdict {
	code := x.status
	switch {
	case x.err != nil && (!x.wrote || closedIdle(x.err)):
		return vRetry
	case x.err != nil:
		return vUncertain
	case code >= 200 && code < 300:
		return vDelivered
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests:
		return vRetry
	case code >= 500 && code < 600:
		if retry5xx {
			return vRetry
		}
		return vUncertain
	case code >= 300 && code < 500:
		return vRefused
	}
	return vUncertain // 1xx as a final answer, or a status outside HTTP's
}

type attempt struct {
	verdict    verdict
	status     int
	reason     string
	retryAfter time.Duration
	unsent     bool // no byte of the request reached the receiver
}

// newClient is the destination's HTTP client: its timeout bounds the whole
// exchange, and redirects are answers, not instructions (a webhook that
// moved is a configuration error, reported as failed). Its connections
// count the bytes that reach the socket, which is what "the request was
// written" means for the answer rule (see Sink.do).
func newClient(d Destination) *http.Client { return newClientOver(d, nil) }

// newClientOver is newClient with its sockets seen through under (nil:
// as they are), for tests that make a socket fail.
func newClientOver(d Destination, under func(net.Conn) net.Conn) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	dial := t.DialContext
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if under != nil {
			c = under(c)
		}
		return &countingConn{Conn: c}, nil
	}
	t.MaxConnsPerHost = d.Concurrency
	t.MaxIdleConnsPerHost = d.Concurrency
	if d.RootCAs != nil {
		t.TLSClientConfig = &tls.Config{RootCAs: d.RootCAs, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{
		Timeout:       d.Timeout,
		Transport:     t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// post sends one signed attempt. ctx should not be the relay's shutdown
// context: a request cut off by shutdown would turn into an unknown outcome.
func (s *Sink) post(ctx context.Context, key string, body []byte) attempt {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.dest.URL, bytes.NewReader(body))
	if err != nil {
		return attempt{verdict: vRefused, reason: "build request: " + err.Error()}
	}
	ts := s.now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "outboxd-webhook")
	req.Header.Set(HeaderIdempotencyKey, key)
	req.Header.Set(HeaderID, key)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, s.dest.signature(key, ts, body, s.now()))
	if !s.dest.Idempotent {
		// net/http silently re-sends a request that has an Idempotency-Key
		// and a GetBody when a reused connection fails; to a receiver that
		// does not dedupe, that would be a second effect.
		req.GetBody = nil
	}
	resp, wrote, err := s.do(req, s.client)
	if err != nil {
		if judge(exchange{wrote: wrote, err: err}, s.dest.Retry5xx) == vUncertain {
			return attempt{verdict: vUncertain, reason: "no answer after the request was sent: " + err.Error()}
		}
		return attempt{verdict: vRetry, unsent: true, reason: "request not sent: " + err.Error()}
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	code := resp.StatusCode
	a := attempt{status: code, verdict: judge(exchange{wrote: true, status: code}, s.dest.Retry5xx)}
	if a.verdict == vDelivered {
		return a
	}
	if a.verdict == vRetry || s.dest.Idempotent {
		a.retryAfter = retryAfter(resp.Header.Get("Retry-After"), s.now())
	}
	a.reason = fmt.Sprintf("HTTP %d", code)
	if a.verdict == vUncertain {
		a.reason += " after the request was written (it may have been processed)"
	}
	if t := strings.TrimSpace(string(snippet)); t != "" {
		a.reason += ": " + strings.ToValidUTF8(t, "?")
	}
	return a
}

// do sends req with c, telling whether any request byte was written.
//
// On a connection of newClient that is whether a byte of this request
// reached the socket. httptrace's WroteRequest is not enough: it reports
// success once the request is in the transport's buffer, and on a
// kept-alive connection the receiver had closed, the flush that follows
// fails with nothing sent; taking that for "written" turned a request
// that never left into an unknown outcome. With another client (a test's)
// WroteRequest is all there is. Over HTTP/2 one connection carries other
// requests' bytes too, which can only err towards "written".
func (s *Sink) do(req *http.Request, c *http.Client) (resp *http.Response, wrote bool, err error) {
	var (
		buffered atomic.Bool
		mu       sync.Mutex
		conn     *countingConn
		start    int64
	)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			nc := i.Conn
			if tc, ok := nc.(interface{ NetConn() net.Conn }); ok {
				nc = tc.NetConn() // TLS: the handshake's bytes came before
			}
			if cc, ok := nc.(*countingConn); ok {
				mu.Lock()
				conn, start = cc, cc.written.Load()
				mu.Unlock()
			}
		},
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				buffered.Store(true)
			}
		},
	}))
	resp, err = c.Do(req)
	mu.Lock()
	defer mu.Unlock()
	if conn != nil {
		return resp, conn.written.Load() > start, err
	}
	return resp, buffered.Load(), err
}

// countingConn counts the bytes written to the socket.
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// retryAfter reads a Retry-After header: seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// headerSafe reports whether key can travel in an HTTP header as is.
func headerSafe(key string) bool {
	for i := 0; i < len(key); i++ {
		if c := key[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

var errShutdown = errors.New("webhook: relay shutting down")
