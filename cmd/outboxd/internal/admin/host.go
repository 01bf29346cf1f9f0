package admin

import (
	"fmt"
	"net"
	"net/http"
	"strings"
)

// hostCheck guards a server without a token against DNS rebinding: a web
// page on the attacker's name, re-resolved to 127.0.0.1, would otherwise
// read the dashboard and metrics from the operator's browser as if it were
// the same site. Such requests carry the attacker's name in Host, so only
// the names the server is actually reached by are served.
type hostCheck struct {
	bound string          // the listening address, for the refusal message
	port  string          // the bound port
	local map[string]bool // hosts (no port) accepted on the bound port
	anyIP bool            // bound to every interface: any IP literal on the bound port
	names map[string]bool // configured names, on any port
	exact map[string]bool // configured host:port pairs
}

func newHostCheck(bound net.Addr, configured []string) (*hostCheck, error) {
	host, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return nil, fmt.Errorf("admin: bound address %s: %w", bound, err)
	}
	c := &hostCheck{bound: bound.String(), port: port, local: map[string]bool{}, names: map[string]bool{}, exact: map[string]bool{}}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		c.local[strings.ToLower(host)] = true
	case ip.IsUnspecified():
		c.anyIP = true
		c.local["localhost"] = true
	case ip.IsLoopback():
		c.local["localhost"], c.local["127.0.0.1"], c.local["::1"] = true, true, true
		c.local[ip.String()] = true
	default:
		c.local[ip.String()] = true
	}
	for _, h := range configured {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if strings.ContainsAny(h, "/@ \t") || strings.Contains(h, "://") {
			return nil, fmt.Errorf("admin: config: Hosts: %q is not a host name or host:port (flag --admin-host)", h)
		}
		if name, p, err := net.SplitHostPort(h); err == nil {
			c.exact[canonicalHost(name)+":"+p] = true
			continue
		}
		c.names[canonicalHost(h)] = true
	}
	return c, nil
}

// canonicalHost lower-cases a host, drops IPv6 brackets and a trailing dot,
// and writes IP literals in their canonical form.
func canonicalHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), ".")
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return h
}

func (c *hostCheck) allowed(hostHeader string) bool {
	host, port, err := net.SplitHostPort(hostHeader)
	if err != nil { // no port: the scheme's default
		host, port = hostHeader, "80"
	}
	host = canonicalHost(host)
	if host == "" {
		return false
	}
	if c.names[host] || c.exact[host+":"+port] {
		return true
	}
	if port != c.port {
		return false
	}
	return c.local[host] || (c.anyIP && net.ParseIP(host) != nil)
}

// wrap refuses, with 421, requests for any other Host. /healthz is exempt,
// as it is from the token: it tells a rebinding page nothing, and probes
// may name the host as they like.
func (c *hostCheck) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || c.allowed(r.Host) {
			h.ServeHTTP(w, r)
			return
		}
		http.Error(w, fmt.Sprintf("misdirected request: Host %q is not an address of this admin server (listening on %s); "+
			"name it with --admin-host, or set --admin-token (this check protects a server without a token from DNS rebinding)",
			r.Host, c.bound), http.StatusMisdirectedRequest)
	})
}
