package indexer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/schema/schematest"
)

// testCA is a certificate authority made up for one test.
type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	pool    *x509.CertPool
	pemPath string
	// serial numbers the certificates issue signs; atomic because the
	// parallel subtests of one test share their CA.
	serial atomic.Int64
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "outboxd test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{cert: cert, key: key, pool: x509.NewCertPool()}
	ca.serial.Store(1) // the CA's own
	ca.pool.AddCert(cert)
	ca.pemPath = writePEM(t, "ca.pem", "CERTIFICATE", der)
	return ca
}

// issue signs a certificate for loopback (a server) or for a client, and
// also writes it and its key as PEM files.
func (ca *testCA) issue(t *testing.T, client bool) (pair tls.Certificate, certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	if client {
		tmpl.Subject.CommonName = "outboxd test client"
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses, tmpl.DNSNames = nil, nil
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath = writePEM(t, "cert.pem", "CERTIFICATE", der)
	keyPath = writePEM(t, "key.pem", "PRIVATE KEY", keyDER)
	pair, err = tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	return pair, certPath, keyPath
}

func writePEM(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tlsProxy is an HTTPS front for the test Elasticsearch, with a
// certificate from a test CA, that lets through only the requests allow
// accepts (it terminates authentication: the test node runs without
// security). With hang set it reads each request and never answers, which
// is what a wedged node or load balancer looks like to the client: when
// the client leaves, it drops the connection without a response.
type tlsProxy struct {
	URL         string
	Fingerprint string // SHA-256 of its certificate, hex
	hang        atomic.Bool
	hung        atomic.Int32 // requests being held unanswered now
}

func newTLSProxy(t *testing.T, ca *testCA, allow func(*http.Request) bool) *tlsProxy {
	t.Helper()
	target, err := url.Parse(schematest.ElasticsearchURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	serverCert, _, _ := ca.issue(t, false)
	p := &tlsProxy{Fingerprint: fingerprintOf(serverCert.Certificate[0])}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !allow(r) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"error":{"type":"security_exception","reason":"test proxy: missing or wrong credentials"},"status":401}`)
				return
			}
			if p.hang.Load() {
				p.hung.Add(1)
				defer p.hung.Add(-1)
				// Read the whole request, so the server notices when the
				// client gives up and cancels the context.
				_, _ = io.Copy(io.Discard, r.Body)
				<-r.Context().Done()
				// Returning would have net/http send an empty 200 on a
				// connection that can still carry one (a client that
				// only closed its side): aborting closes it unanswered.
				panic(http.ErrAbortHandler)
			}
			r.Header.Del("Authorization")
			rp.ServeHTTP(w, r)
		}),
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go srv.Serve(tls.NewListener(ln, &tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    ca.pool,
	}))
	// Close also drops held connections, which ends the held handlers.
	t.Cleanup(func() { srv.Close() })
	p.URL = "https://" + ln.Addr().String()
	return p
}

func fingerprintOf(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// pingAnswered pings until the node answers: the check that a setup works
// before a test makes its proxy hang. On a loaded machine a request through
// the proxy to Elasticsearch can outlast a short client timeout, so that
// timeout is retried for a while; any other error is the setup's and fails
// at once.
func pingAnswered(t *testing.T, es *elasticsearch.Client) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := Ping(context.Background(), es)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "client timeout") || time.Now().After(deadline) {
			t.Fatalf("before the hang: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
