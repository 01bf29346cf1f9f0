package indexer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// The relay's writes carry no deadline: the client's timeout is all that
// stands between a node that stops answering and a stream stuck forever.
// This runs the configuration path outboxd relay uses (ClientConfigFrom,
// then NewClient) with a CA certificate and basic auth, through an HTTPS
// proxy in front of the test Elasticsearch.
func TestClientTLSWithBasicAuth(t *testing.T) {
	t.Parallel()
	es, name := setup(t)
	// Index creation can be slow on a loaded test machine: done here, not
	// under the short timeout this test is about.
	if err := Bootstrap(context.Background(), es, name, nil); err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t)
	const user, password = "outboxd", "tls-test-secret"
	p := newTLSProxy(t, ca, func(r *http.Request) bool {
		u, pw, ok := r.BasicAuth()
		return ok && u == user && pw == password
	})
	const timeout = 2 * time.Second
	env := map[string]string{
		"ELASTICSEARCH_URL":      p.URL,
		"ELASTICSEARCH_CA_CERT":  ca.pemPath,
		"ELASTICSEARCH_USERNAME": user,
		"ELASTICSEARCH_PASSWORD": password,
		"ELASTICSEARCH_TIMEOUT":  timeout.String(),
	}
	cfg, err := ClientConfigFrom(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	tlsClient, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("writes through the proxy succeed", func(t *testing.T) {
		s := newSink(t, Options{Client: tlsClient})
		if got := statuses(mustWrite(t, s, upsert(name, "a", 1, docN(1)))); got != "applied" {
			t.Fatalf("got %s", got)
		}
		if d := getDoc(t, es, name, "a"); d.Version != 1 {
			t.Fatalf("stored version %d, want 1", d.Version)
		}
	})

	t.Run("the proxy checks the password", func(t *testing.T) {
		wrong := cfg
		wrong.Password = "not-the-password"
		c, err := NewClient(wrong)
		if err != nil {
			t.Fatal(err)
		}
		// A configuration error of the sink, not the event's fault: the
		// relay pauses and retries, charging no event.
		_, err = newSink(t, Options{Client: c}).Write(context.Background(), []outbox.Event{upsert(name, "b", 1, `{}`)})
		if !IsConfig(err) || !strings.Contains(err.Error(), "401") {
			t.Fatalf("Write with a wrong password: %v, want a configuration error naming the 401", err)
		}
	})

	t.Run("a proxy that stops answering is a counted sink outage within the timeout, and delivery resumes after", func(t *testing.T) {
		pool, schemaName := schematest.Setup(t)
		ob, err := outbox.NewOutbox(schemaName)
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		r, err := relay.New(relay.Config{
			Pool: pool, Schema: schemaName, Sink: newSink(t, Options{Client: tlsClient, Registerer: reg}),
			BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, LeaseInterval: 100 * time.Millisecond,
			Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() {
			p.hang.Store(false)
			stop()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("relay: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("relay did not stop")
			}
		})
		appendDoc := func(id string) {
			t.Helper()
			if _, err := ob.Append(context.Background(), pool, upsert(name, id, 1, docN(1))); err != nil {
				t.Fatal(err)
			}
		}
		appendDoc("before")
		schematest.Eventually(t, 30*time.Second, "the first event is delivered", func() bool { return getDoc(t, es, name, "before").Found })

		p.hang.Store(true)
		errorsBefore := counterSum(t, reg, "outboxd_sink_errors_total")
		start := time.Now()
		appendDoc("during")
		schematest.Eventually(t, 20*time.Second, "a sink error is counted", func() bool {
			return counterSum(t, reg, "outboxd_sink_errors_total") > errorsBefore
		})
		took := time.Since(start)
		t.Logf("a hanging node became a counted sink error after %s (timeout %s)", took.Round(time.Millisecond), timeout)
		if bound := timeout + 3*time.Second; took > bound {
			t.Fatalf("the sink error took %s, want under %s", took, bound)
		}

		p.hang.Store(false)
		schematest.Eventually(t, 30*time.Second, "the held event is delivered once the node answers", func() bool {
			st, err := relay.CollectStats(context.Background(), pool, schemaName)
			return err == nil && st.Backlog() == 0 && getDoc(t, es, name, "during").Found
		})
		var dead int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+schemaName+`".dead_letters`).Scan(&dead); err != nil {
			t.Fatal(err)
		}
		if dead != 0 {
			t.Fatalf("%d events dead-lettered by the outage", dead)
		}
	})
}

// Every TLS and authentication setting builds its transport differently;
// each must still give up on a node that does not answer.
func TestClientTimeoutsInEveryConfiguration(t *testing.T) {
	t.Parallel()
	const timeout = 500 * time.Millisecond
	ca := newTestCA(t)
	_, clientCert, clientKey := ca.issue(t, true)
	anyone := func(*http.Request) bool { return true }
	for _, c := range []struct {
		name  string
		cfg   ClientConfig
		allow func(*http.Request) bool
	}{
		{"a CA certificate", ClientConfig{CACertPath: ca.pemPath}, anyone},
		{"a CA certificate and basic auth", ClientConfig{CACertPath: ca.pemPath, Username: "u", Password: "pw"}, func(r *http.Request) bool {
			u, pw, ok := r.BasicAuth()
			return ok && u == "u" && pw == "pw"
		}},
		{"a CA certificate and an API key", ClientConfig{CACertPath: ca.pemPath, APIKey: "key-secret"}, func(r *http.Request) bool {
			return r.Header.Get("Authorization") == "APIKey key-secret"
		}},
		{"a client certificate", ClientConfig{CACertPath: ca.pemPath, ClientCertPath: clientCert, ClientKeyPath: clientKey}, func(r *http.Request) bool {
			return len(r.TLS.PeerCertificates) > 0
		}},
		{"a certificate fingerprint", ClientConfig{}, anyone},
	} {
		t.Run("with "+c.name+" a node that stops answering is an error within the timeout", func(t *testing.T) {
			t.Parallel()
			p := newTLSProxy(t, ca, c.allow)
			cfg := c.cfg
			cfg.Addresses, cfg.Timeout = []string{p.URL}, timeout
			if c.name == "a certificate fingerprint" {
				cfg.CertificateFingerprint = strings.ToUpper(colons(p.Fingerprint)) // as openssl prints it
			}
			es, err := NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			pingAnswered(t, es)
			p.hang.Store(true)
			took, err := pingBounded(t, es, 20*time.Second)
			if err == nil || !strings.Contains(err.Error(), "client timeout") {
				t.Fatalf("Ping of a hanging node: %v, want a timeout naming the client timeout", err)
			}
			if bound := timeout + 2*time.Second; took > bound {
				t.Fatalf("took %s, want under %s", took, bound)
			}
		})
	}

	t.Run("a node that accepts connections but never completes the TLS handshake is an error within the timeout", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				held = append(held, c)
			}
		}()
		es, err := NewClient(ClientConfig{Addresses: []string{"https://" + ln.Addr().String()}, CACertPath: ca.pemPath, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		took, err := pingBounded(t, es, 20*time.Second)
		if err == nil {
			t.Fatal("Ping succeeded against a node that never answers")
		}
		if bound := timeout + 2*time.Second; took > bound {
			t.Fatalf("took %s, want under %s", took, bound)
		}
	})

	t.Run("a fingerprint that matches nothing is refused", func(t *testing.T) {
		t.Parallel()
		p := newTLSProxy(t, ca, anyone)
		es, err := NewClient(ClientConfig{Addresses: []string{p.URL}, CertificateFingerprint: strings.Repeat("ab", 32), Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := Ping(context.Background(), es); err == nil || !strings.Contains(err.Error(), "ELASTICSEARCH_CERT_FINGERPRINT") {
			t.Fatalf("Ping with a wrong fingerprint: %v", err)
		}
	})

	t.Run("bad TLS settings are named", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			cfg  ClientConfig
			want string
		}{
			{ClientConfig{CertificateFingerprint: "xyz"}, "cert_fingerprint"},
			{ClientConfig{ClientCertPath: clientCert}, "client_key"},
			{ClientConfig{CACertPath: clientKey}, "ca_cert"},
			{ClientConfig{Timeout: -time.Second}, "timeout"},
		} {
			c.cfg.Addresses = []string{"https://127.0.0.1:9"}
			if _, err := NewClient(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("NewClient(%+v) = %v, want an error naming %s", c.cfg, err, c.want)
			}
		}
	})
}

func TestSinkWriteDeadline(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	const deadline = 300 * time.Millisecond
	newHanging := func(t *testing.T) (*Sink, *tlsProxy) {
		p := newTLSProxy(t, ca, func(*http.Request) bool { return true })
		// A client timeout far beyond the test: only the Write's own
		// deadline can end it.
		es, err := NewClient(ClientConfig{Addresses: []string{p.URL}, CACertPath: ca.pemPath, Timeout: 10 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return newSink(t, Options{Client: es}), p
	}

	t.Run("a Write to a node that stops answering returns at its deadline", func(t *testing.T) {
		t.Parallel()
		_, name := setup(t)
		s, p := newHanging(t)
		mustWrite(t, s, upsert(name, "warm", 1, `{}`)) // bootstrap while the node answers
		p.hang.Store(true)
		took, err := writeBounded(t, s, deadline, upsert(name, "a", 1, `{}`))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Write: %v, want context.DeadlineExceeded", err)
		}
		if bound := deadline + 2*time.Second; took > bound {
			t.Fatalf("took %s, want under %s", took, bound)
		}
	})

	t.Run("a Write waiting for another Write's bootstrap of its index returns at its deadline", func(t *testing.T) {
		t.Parallel()
		_, name := setup(t)
		s, p := newHanging(t)
		p.hang.Store(true)
		first, cancelFirst := context.WithCancel(context.Background())
		firstDone := make(chan struct{})
		go func() {
			defer close(firstDone)
			_, _ = s.Write(first, []outbox.Event{upsert(name, "first", 1, `{}`)})
		}()
		t.Cleanup(func() { cancelFirst(); <-firstDone })
		schematest.Eventually(t, 10*time.Second, "the first Write's bootstrap is held by the node", func() bool { return p.hung.Load() > 0 })
		took, err := writeBounded(t, s, deadline, upsert(name, "second", 1, `{}`))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Write: %v, want context.DeadlineExceeded", err)
		}
		if bound := deadline + 2*time.Second; took > bound {
			t.Fatalf("took %s, want under %s", took, bound)
		}
	})
}

func pingBounded(t *testing.T, es *elasticsearch.Client, limit time.Duration) (time.Duration, error) {
	t.Helper()
	return bounded(t, limit, func() error { return Ping(context.Background(), es) })
}

func writeBounded(t *testing.T, s *Sink, deadline time.Duration, events ...outbox.Event) (time.Duration, error) {
	t.Helper()
	return bounded(t, deadline+20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		_, err := s.Write(ctx, events)
		return err
	})
}

// bounded runs fn and reports its error and how long it took; it fails
// the test, instead of hanging it, when fn does not return within limit.
func bounded(t *testing.T, limit time.Duration, fn func() error) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(limit):
		t.Fatalf("still waiting after %s", limit)
		return 0, nil
	}
}

func counterSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func colons(hexDigits string) string {
	var b strings.Builder
	for i := 0; i < len(hexDigits); i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		fmt.Fprint(&b, hexDigits[i:i+2])
	}
	return b.String()
}
