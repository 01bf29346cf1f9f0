package admin_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/relay"
)

// getHost fetches path from the admin server on loopback, sending host as
// the Host header, as a browser would after resolving that name here.
func (e *testEnv) getHost(t *testing.T, path, host string, header ...string) (int, string) {
	t.Helper()
	_, port, err := net.SplitHostPort(e.srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest("GET", "http://127.0.0.1:"+port+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func (e *testEnv) port(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(e.srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func TestAdminHostCheck(t *testing.T) {
	t.Parallel()

	t.Run("on loopback", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.startAdmin(t, admin.Config{Hosts: []string{"dash.example", "ops.example:7000"}})
		port := e.port(t)
		for _, host := range []string{e.srv.Addr(), "localhost:" + port, "LocalHost:" + port, "[::1]:" + port,
			"dash.example:" + port, "dash.example", "ops.example:7000"} {
			t.Run(host+" is served", func(t *testing.T) {
				for _, path := range []string{"/", "/api/summary", "/metrics"} {
					if code, body := e.getHost(t, path, host); code != 200 {
						t.Fatalf("%s: %d %s", path, code, body)
					}
				}
			})
		}
		for _, host := range []string{"evil.example:" + port, "evil.example", "localhost:1", "127.0.0.1", "ops.example:" + port, "dash.example.evil.example:" + port, "10.0.0.1:" + port} {
			t.Run(host+" is refused with 421 naming the flag", func(t *testing.T) {
				for _, path := range []string{"/", "/api/summary", "/metrics", "/readyz"} {
					code, body := e.getHost(t, path, host)
					if code != http.StatusMisdirectedRequest || !strings.Contains(body, "--admin-host") || !strings.Contains(body, "--admin-token") {
						t.Fatalf("%s: %d %s", path, code, body)
					}
				}
			})
		}
		t.Run("/healthz answers any Host", func(t *testing.T) {
			if code, body := e.getHost(t, "/healthz", "evil.example:"+port); code != 200 {
				t.Fatalf("%d %s", code, body)
			}
		})
	})

	t.Run("bound to every interface, IP addresses on its port and localhost are served, other names are not", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.startAdmin(t, admin.Config{Addr: ":0"})
		port := e.port(t)
		for _, host := range []string{"10.1.2.3:" + port, "[fd00::1]:" + port, "localhost:" + port} {
			if code, body := e.getHost(t, "/", host); code != 200 {
				t.Fatalf("%s: %d %s", host, code, body)
			}
		}
		for _, host := range []string{"evil.example:" + port, "10.1.2.3:1"} {
			if code, _ := e.getHost(t, "/", host); code != http.StatusMisdirectedRequest {
				t.Fatalf("%s: %d, want 421", host, code)
			}
		}
	})

	t.Run("with a token the Host is not checked", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.startAdmin(t, admin.Config{Token: "host-test-token"})
		if code, _ := e.getHost(t, "/", "evil.example"); code != http.StatusUnauthorized {
			t.Fatalf("no token: %d, want 401", code)
		}
		if code, body := e.getHost(t, "/", "relay-1.internal:9464", "Authorization", "Bearer host-test-token"); code != 200 {
			t.Fatalf("with the token: %d %s", code, body)
		}
	})

	t.Run("a value that is not a host name is refused at New, naming the flag", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		_, err := admin.New(admin.Config{Addr: "127.0.0.1:0", Hosts: []string{"http://dash.example/"}, Gatherer: e.reg,
			Stats: func(context.Context) (*relay.Stats, error) { return &relay.Stats{}, nil }})
		if err == nil || !strings.Contains(err.Error(), "--admin-host") || !strings.Contains(err.Error(), "http://dash.example/") {
			t.Fatalf("err = %v", err)
		}
	})
}
