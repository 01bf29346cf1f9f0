package webhook_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/webhook"
)

// During a rotation, every request carries a signature by the new and by
// the previous secret, so a receiver still on the old one and a receiver
// already on the new one both verify it; after the grace window only the
// new one signs.
func TestSecretRotation(t *testing.T) {
	t.Parallel()
	newSecret, oldSecret := []byte("new-secret-0123456789"), []byte("old-secret-0123456789")
	env := map[string]string{
		"NEW": "whsec_" + base64.StdEncoding.EncodeToString(newSecret),
		"OLD": "whsec_" + base64.StdEncoding.EncodeToString(oldSecret),
	}
	var mu sync.Mutex
	verified := map[string][]string{} // key -> which secrets verify it
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get(webhook.HeaderID)
		mu.Lock()
		for name, s := range map[string][]byte{"new": newSecret, "old": oldSecret} {
			if webhook.Verify(s, r.Header, body, time.Now(), 0) == nil {
				verified[key] = append(verified[key], name)
			}
		}
		mu.Unlock()
	}))
	defer srv.Close()
	e := setup(t)
	parse := func(name, opts string) webhook.Destination {
		d, err := webhook.ParseDestination(name+"="+srv.URL+",secret_env=NEW"+opts, func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	grace := parse("grace", ",previous_secret_env=OLD,previous_secret_until="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	over := parse("over", ",previous_secret_env=OLD,previous_secret_until="+time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))
	if s := grace.String(); strings.Contains(s, "old-secret") || !strings.Contains(s, "previous_secret=yes") {
		t.Fatalf("String: %s", s)
	}
	e.run(t, grace, over)
	e.send(t, "grace", "in-grace", `{}`)
	e.send(t, "over", "after-grace", `{}`)
	e.waitState(t, "grace", "in-grace", webhook.StateDelivered)
	e.waitState(t, "over", "after-grace", webhook.StateDelivered)
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(slices.Sorted(slices.Values(verified["in-grace"])), ","); got != "new,old" {
		t.Errorf("during the grace window the request verifies with %q, want new,old", got)
	}
	if got := strings.Join(verified["after-grace"], ","); got != "new" {
		t.Errorf("after the grace window the request verifies with %q, want new only", got)
	}
	if _, err := webhook.ParseDestination("x=http://h,secret_env=NEW,previous_secret_until=2026-01-01T00:00:00Z", func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "previous_secret_until") {
		t.Errorf("an end without a previous secret: %v", err)
	}
}

// A receiver behind a private CA is reached with ca_file=, and without it
// the TLS handshake refuses the receiver (nothing is sent).
func TestDestinationCAFile(t *testing.T) {
	t.Parallel()
	caPEM, leaf := privateCA(t)
	var mu sync.Mutex
	got := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got++
		mu.Unlock()
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	getenv := func(string) string { return "s3cret" }
	withCA, err := webhook.ParseDestination("private="+srv.URL+",secret_env=S,ca_file="+caFile, getenv)
	if err != nil {
		t.Fatal(err)
	}
	withoutCA, err := webhook.ParseDestination("public="+srv.URL+",secret_env=S", getenv)
	if err != nil {
		t.Fatal(err)
	}
	withoutCA.MaxAttempts, withoutCA.BackoffBase, withoutCA.BackoffMax = 2, time.Millisecond, time.Millisecond
	e := setup(t)
	e.run(t, withCA, withoutCA)
	e.send(t, "private", "k", `{}`)
	e.send(t, "public", "k", `{}`)
	e.waitState(t, "private", "k", webhook.StateDelivered)
	d := e.waitUnsent(t, "public", "k")
	if !strings.Contains(d.LastError, "certificate") {
		t.Errorf("without ca_file: %q, want a certificate error", d.LastError)
	}
	mu.Lock()
	defer mu.Unlock()
	if got != 1 {
		t.Errorf("the receiver got %d requests, want 1 (the private destination's)", got)
	}
	if _, err := webhook.ParseDestination("x=https://h,secret_env=S,ca_file="+filepath.Join(t.TempDir(), "none.pem"), getenv); err == nil || !strings.Contains(err.Error(), "ca_file") {
		t.Errorf("a missing ca_file: %v", err)
	}
}

// privateCA makes a CA and a certificate it signs for 127.0.0.1.
func privateCA(t *testing.T) (caPEM []byte, leaf tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outboxd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
