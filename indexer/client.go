package indexer

import (
	"fmt"
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
	CACertPath             string
	CertificateFingerprint string
	Timeout                time.Duration // per request; 0 means 30s
}

// ClientConfigFromEnv reads ELASTICSEARCH_URL (comma-separated nodes),
// ELASTICSEARCH_USERNAME, ELASTICSEARCH_PASSWORD, ELASTICSEARCH_API_KEY,
// ELASTICSEARCH_CA_CERT (a file), ELASTICSEARCH_CERT_FINGERPRINT and
// ELASTICSEARCH_TIMEOUT (a Go duration).
func ClientConfigFromEnv() (ClientConfig, error) {
	c := ClientConfig{
		Username:               os.Getenv("ELASTICSEARCH_USERNAME"),
		Password:               os.Getenv("ELASTICSEARCH_PASSWORD"),
		APIKey:                 os.Getenv("ELASTICSEARCH_API_KEY"),
		CACertPath:             os.Getenv("ELASTICSEARCH_CA_CERT"),
		CertificateFingerprint: os.Getenv("ELASTICSEARCH_CERT_FINGERPRINT"),
	}
	if u := os.Getenv("ELASTICSEARCH_URL"); u != "" {
		c.Addresses = SplitAddresses(u)
	}
	if t := os.Getenv("ELASTICSEARCH_TIMEOUT"); t != "" {
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

// NewClient builds a go-elasticsearch client. Transport retries are turned
// off: the sink classifies and retries each item itself, with backoff.
func NewClient(c ClientConfig) (*elasticsearch.Client, error) {
	if len(c.Addresses) == 0 {
		return nil, fmt.Errorf("indexer: addresses: no Elasticsearch URL (set ELASTICSEARCH_URL or --elasticsearch-url)")
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	cfg := elasticsearch.Config{
		Addresses:              c.Addresses,
		Username:               c.Username,
		Password:               c.Password,
		APIKey:                 c.APIKey,
		CertificateFingerprint: c.CertificateFingerprint,
		DisableRetry:           true,
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			MaxIdleConnsPerHost:   32,
			ResponseHeaderTimeout: timeout,
			IdleConnTimeout:       90 * time.Second,
		},
	}
	if c.CACertPath != "" {
		pem, err := os.ReadFile(c.CACertPath)
		if err != nil {
			return nil, fmt.Errorf("indexer: ca_cert: %w", err)
		}
		cfg.CACert = pem
		cfg.Transport = nil // the client builds a TLS transport around CACert
	}
	es, err := elasticsearch.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("indexer: %w", err)
	}
	return es, nil
}
