package indexer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
)

// ClientConfig says how to reach Elasticsearch. Secrets in it are never
// logged; String redacts them.
type ClientConfig struct {
	Addresses              []string
	Username               string
	Password               string
	APIKey                 string
	CACertPath             string        // PEM file of the CA that signed the nodes' certificates
	ClientCertPath         string        // PEM files of a client certificate and its key, for
	ClientKeyPath          string        // clusters that require TLS client authentication
	CertificateFingerprint string        // SHA-256 of a node certificate, pinned
	Timeout                time.Duration // bounds each request as a whole, connecting included; 0 means 30s
	AWS                    *AWSSigning   // sign requests with AWS SigV4 (Amazon OpenSearch Service); nil: no signing
}

// ClientConfigFrom reads the connection settings through getenv: the
// variables ELASTICSEARCH_URL (comma-separated nodes),
// ELASTICSEARCH_USERNAME, ELASTICSEARCH_PASSWORD, ELASTICSEARCH_API_KEY,
// ELASTICSEARCH_CA_CERT, ELASTICSEARCH_CLIENT_CERT, ELASTICSEARCH_CLIENT_KEY,
// ELASTICSEARCH_CERT_FINGERPRINT and ELASTICSEARCH_TIMEOUT. The package
// never reads the environment itself: a command passes os.Getenv, a test a
// map's lookup.
func ClientConfigFrom(getenv func(key string) string) (ClientConfig, error) {
	c := ClientConfig{
		Username:               getenv("ELASTICSEARCH_USERNAME"),
		Password:               getenv("ELASTICSEARCH_PASSWORD"),
		APIKey:                 getenv("ELASTICSEARCH_API_KEY"),
		CACertPath:             getenv("ELASTICSEARCH_CA_CERT"),
		ClientCertPath:         getenv("ELASTICSEARCH_CLIENT_CERT"),
		ClientKeyPath:          getenv("ELASTICSEARCH_CLIENT_KEY"),
		CertificateFingerprint: getenv("ELASTICSEARCH_CERT_FINGERPRINT"),
	}
	if u := getenv("ELASTICSEARCH_URL"); u != "" {
		c.Addresses = SplitAddresses(u)
	}
	if t := getenv("ELASTICSEARCH_TIMEOUT"); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil {
			return c, fmt.Errorf("ELASTICSEARCH_TIMEOUT: %q is not a duration (e.g. 30s): %w", t, err)
		}
		c.Timeout = d
	}
	return c, nil
}

// SplitAddresses splits a comma-separated node list.
func SplitAddresses(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, strings.TrimRight(a, "/"))
		}
	}
	return out
}

// String describes the config without secrets, for logs.
func (c ClientConfig) String() string {
	auth := "none"
	switch {
	case c.AWS != nil:
		auth = "aws-sigv4(" + c.AWS.Service + "," + c.AWS.Region + ")"
	case c.APIKey != "":
		auth = "api-key"
	case c.Username != "":
		auth = "basic(" + c.Username + ")"
	}
	return fmt.Sprintf("addresses=%s auth=%s", strings.Join(redactURLs(c.Addresses), ","), auth)
}

func redactURLs(addrs []string) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		// A password may ride in the URL's userinfo.
		if at := strings.LastIndex(a, "@"); at >= 0 {
			if scheme := strings.Index(a, "://"); scheme >= 0 && scheme < at {
				a = a[:scheme+3] + "REDACTED" + a[at:]
			}
		}
		out[i] = a
	}
	return out
}

// NewClient builds a go-elasticsearch client over outboxd's own transport,
// so every TLS and authentication setting (CA, client certificate,
// fingerprint, basic auth, API key, a proxy from HTTPS_PROXY) shares the
// same timeouts: left to go-elasticsearch, a CA certificate or fingerprint
// replaces the transport, and its timeouts with it. Transport retries are
// turned off: the sink classifies and retries each item itself, with
// backoff.
func NewClient(c ClientConfig) (*elasticsearch.Client, error) {
	if len(c.Addresses) == 0 {
		return nil, fmt.Errorf("indexer: addresses: no Elasticsearch URL given")
	}
	timeout := c.Timeout
	if timeout < 0 {
		return nil, fmt.Errorf("indexer: timeout: must be positive, got %s", timeout)
	}
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	tlsCfg, err := c.tlsConfig()
	if err != nil {
		return nil, err
	}
	var rt http.RoundTripper = deadlineTransport{timeout: timeout, next: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
	}}
	if c.AWS != nil {
		if err := c.AWS.check(c); err != nil {
			return nil, err
		}
		rt = newSigV4Transport(*c.AWS, rt)
	}
	es, err := elasticsearch.NewClient(elasticsearch.Config{
		Addresses:    c.Addresses,
		Username:     c.Username,
		Password:     c.Password,
		APIKey:       c.APIKey,
		DisableRetry: true,
		Transport:    productTransport{next: rt},
	})
	if err != nil {
		return nil, fmt.Errorf("indexer: %w", err)
	}
	return es, nil
}

// tlsConfig returns nil when no TLS setting is given (the system roots
// then verify https nodes).
func (c ClientConfig) tlsConfig() (*tls.Config, error) {
	if c.CACertPath == "" && c.CertificateFingerprint == "" && c.ClientCertPath == "" && c.ClientKeyPath == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CACertPath != "" {
		pem, err := os.ReadFile(c.CACertPath)
		if err != nil {
			return nil, fmt.Errorf("indexer: ca_cert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("indexer: ca_cert: %s holds no PEM certificate", c.CACertPath)
		}
	}
	if (c.ClientCertPath == "") != (c.ClientKeyPath == "") {
		return nil, errors.New("indexer: client_cert, client_key: set both (ELASTICSEARCH_CLIENT_CERT and ELASTICSEARCH_CLIENT_KEY) or neither")
	}
	if c.ClientCertPath != "" {
		pair, err := tls.LoadX509KeyPair(c.ClientCertPath, c.ClientKeyPath)
		if err != nil {
			return nil, fmt.Errorf("indexer: client_cert, client_key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if c.CertificateFingerprint != "" {
		want, err := hex.DecodeString(strings.ReplaceAll(c.CertificateFingerprint, ":", ""))
		if err != nil || len(want) != sha256.Size {
			return nil, errors.New("indexer: cert_fingerprint: must be a certificate's SHA-256 as 64 hex digits (colons allowed)")
		}
		// The pinned certificate replaces chain verification, as
		// Elasticsearch's own clients do with a fingerprint.
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			for _, cert := range cs.PeerCertificates {
				if sum := sha256.Sum256(cert.Raw); bytes.Equal(sum[:], want) {
					return nil
				}
			}
			return errors.New("indexer: cert_fingerprint: no certificate the node presented matches ELASTICSEARCH_CERT_FINGERPRINT")
		}
	}
	return cfg, nil
}

// deadlineTransport bounds each request as a whole. The http.Transport
// timeouts cover connecting, the TLS handshake and the wait for headers,
// but not a proxy's CONNECT nor a body that stops halfway; the relay's
// writes carry no deadline of their own, so without this a stalled node
// would hold a stream forever.
type deadlineTransport struct {
	timeout time.Duration
	next    http.RoundTripper
}

func (d deadlineTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(req.Context(), d.timeout)
	res, err := d.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		var ne net.Error
		timedOut := req.Context().Err() == nil && (ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout())
		cancel()
		if timedOut {
			return nil, fmt.Errorf("no answer within the client timeout of %s: %w", d.timeout, err)
		}
		return nil, err
	}
	res.Body = &cancelOnClose{ReadCloser: res.Body, cancel: cancel}
	return res, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// productTransport lets the v8 client talk to OpenSearch: the client
// refuses every 2xx answer without "X-Elastic-Product: Elasticsearch"
// (which OpenSearch does not send) and offers no switch to skip that
// check, so the header is supplied here, below the client. The product is
// told by detectVersion instead, from GET /, and every request whose
// parameters differ between the products is built for the one detected.
type productTransport struct{ next http.RoundTripper }

func (p productTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := p.next.RoundTrip(req)
	if err == nil && res.Header.Get("X-Elastic-Product") == "" {
		res.Header.Set("X-Elastic-Product", "Elasticsearch")
	}
	return res, err
}
