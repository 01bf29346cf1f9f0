package webhook

import (
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// Destination is one webhook receiver and how to deliver to it.
type Destination struct {
	Name string
	URL  string
	// Secret signs every request (Standard Webhooks). Never logged: String
	// and the errors of this package leave it out.
	Secret []byte
	// PreviousSecret, while a receiver moves to Secret, signs every request
	// too (Standard Webhooks allows several signatures), until
	// PreviousUntil when that is set.
	PreviousSecret []byte
	PreviousUntil  time.Time
	// RootCAs verifies the receiver's TLS certificate instead of the
	// system roots (a private CA: ca_file=PEM).
	RootCAs *x509.CertPool
	// Idempotent says the receiver dedupes by Idempotency-Key, so a request
	// whose outcome is unknown (timeout or reset after it was sent) may be
	// sent again. Otherwise such a message is parked as unknown.
	Idempotent bool
	// Retry5xx is the receiver owner's promise that a 5xx answer means the
	// request had no effect, so it may be sent again. Otherwise a 5xx to a
	// non-idempotent destination parks the message as unknown.
	Retry5xx    bool
	Timeout     time.Duration // per request; default 5s
	Concurrency int           // requests in flight; default 4
	Rate        float64       // requests per second; 0: unlimited
	// Check is an eligibility query run just before each attempt with $1
	// the dedupe key (text) and $2 the payload (cast it: $2::jsonb). A
	// first column false, NULL or no row at all skips the message.
	Check string
	// CheckTimeout is the check's statement timeout; default 2s. Checks
	// run READ ONLY.
	CheckTimeout time.Duration

	// BreakerFailures consecutive failed attempts pause the destination
	// for BreakerCooldown (default 30s), after which one attempt probes
	// it; 0 (the default) never pauses.
	BreakerFailures int
	BreakerCooldown time.Duration

	MaxAttempts int           // requests that reached the receiver before giving up, and runs of a check that errs transiently; default 8 (one never sent is not counted)
	BackoffBase time.Duration // default 500ms, doubling with jitter
	BackoffMax  time.Duration // default 1m; a longer Retry-After (up to 10m) wins

	// RetryInline bounds how long one message may hold back the others:
	// a message is retried in line (its page waits) only while its next
	// attempt would start within RetryInline of its first; past that it
	// is parked in the ledger as retrying, its event acknowledged, and the
	// destination's leader sends it when due. Default 5s; negative: never
	// in line (parked at its first retry). A page so waits at most
	// RetryInline plus one attempt (Timeout, and CheckTimeout with a check).
	RetryInline time.Duration
}

// DefaultRetryInline is Destination.RetryInline's default.
const DefaultRetryInline = 5 * time.Second

func (d *Destination) setDefaults() {
	if d.Timeout <= 0 {
		d.Timeout = 5 * time.Second
	}
	if d.Concurrency <= 0 {
		d.Concurrency = 4
	}
	if d.CheckTimeout <= 0 {
		d.CheckTimeout = 2 * time.Second
	}
	if d.BreakerCooldown <= 0 {
		d.BreakerCooldown = 30 * time.Second
	}
	if d.MaxAttempts <= 0 {
		d.MaxAttempts = 8
	}
	if d.BackoffBase <= 0 {
		d.BackoffBase = 500 * time.Millisecond
	}
	if d.BackoffMax <= 0 {
		d.BackoffMax = time.Minute
	}
	if d.RetryInline == 0 {
		d.RetryInline = DefaultRetryInline
	}
}

// String describes the destination without its secret, for logs: the
// URL is redacted (its path and query may hold a token).
func (d Destination) String() string {
	s := fmt.Sprintf("%s=%s idempotent=%t timeout=%s concurrency=%d", d.Name, RedactURL(d.URL), d.Idempotent, d.Timeout, d.Concurrency)
	if d.Retry5xx {
		s += " retry_5xx=true"
	}
	if d.Rate > 0 {
		s += fmt.Sprintf(" rate=%g/s", d.Rate)
	}
	if d.RetryInline != DefaultRetryInline {
		s += fmt.Sprintf(" retry_inline=%s", max(d.RetryInline, 0))
	}
	if d.Check != "" {
		s += " check=yes"
	}
	if len(d.PreviousSecret) > 0 {
		s += " previous_secret=yes"
		if !d.PreviousUntil.IsZero() {
			s += " until " + d.PreviousUntil.UTC().Format(time.RFC3339)
		}
	}
	if d.RootCAs != nil {
		s += " ca_file=yes"
	}
	return s
}

func (d *Destination) validate() error {
	if err := outbox.ValidateDestination(d.Name); err != nil {
		return err
	}
	u, err := url.Parse(d.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("destination %s: url: %s is not an http(s) URL with a host", d.Name, RedactURL(d.URL))
	}
	if len(d.Secret) == 0 {
		return fmt.Errorf("destination %s: secret: required (secret_env=VAR)", d.Name)
	}
	return nil
}

// ParseDestination reads the --destination flag's value:
//
//	NAME=URL[,secret_env=VAR][,previous_secret_env=VAR[,previous_secret_until=RFC3339]][,ca_file=PEM]
//	        [,idempotent=true][,retry_5xx=true][,timeout=5s][,concurrency=N][,rate=N/s]
//	        [,breaker_failures=N][,breaker_cooldown=30s][,retry_inline=5s][,check_timeout=2s][,check=SQL]
//
// previous_secret_env holds the secret being rotated out: requests are
// signed with both until previous_secret_until (or as long as the option
// stays). ca_file is a PEM file of the CA certificates that verify the
// receiver (a private CA), instead of the system roots. retry_inline is
// Destination.RetryInline (0s: park a message at its first retry).
// check comes last and takes the rest of the value, commas included. The
// secret is read from the environment variable VAR (a Standard Webhooks
// "whsec_<base64>" secret, or raw bytes); getenv is os.Getenv when nil.
func ParseDestination(spec string, getenv func(string) string) (Destination, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var d Destination
	head, check, hasCheck := strings.Cut(spec, ",check=")
	if hasCheck {
		if d.Check = strings.TrimSpace(check); d.Check == "" {
			return d, fmt.Errorf("destination: check: empty SQL")
		}
	}
	parts := strings.Split(head, ",")
	name, rawURL, ok := strings.Cut(parts[0], "=")
	if !ok || strings.Contains(name, "/") {
		// parts[0] may be a bare URL: show it redacted.
		return d, fmt.Errorf("destination: %s: want NAME=URL[,option=value...]", RedactURL(parts[0]))
	}
	d.Name, d.URL = strings.TrimSpace(name), strings.TrimSpace(rawURL)
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			// Not quoted: a comma inside the URL's query would put part of a token here.
			return d, fmt.Errorf("destination %s: an option without a value: want option=value, separated by commas (escape a comma in the URL as %%2C)", d.Name)
		}
		var err error
		switch k {
		case "secret_env":
			raw := getenv(v)
			if raw == "" {
				return d, fmt.Errorf("destination %s: secret_env: environment variable %s is not set", d.Name, v)
			}
			if d.Secret, err = ParseSecret(raw); err != nil {
				return d, fmt.Errorf("destination %s: secret_env: %s: %w", d.Name, v, err)
			}
		case "previous_secret_env":
			raw := getenv(v)
			if raw == "" {
				return d, fmt.Errorf("destination %s: previous_secret_env: environment variable %s is not set", d.Name, v)
			}
			if d.PreviousSecret, err = ParseSecret(raw); err != nil {
				return d, fmt.Errorf("destination %s: previous_secret_env: %s: %w", d.Name, v, err)
			}
		case "previous_secret_until":
			if d.PreviousUntil, err = time.Parse(time.RFC3339, v); err != nil {
				return d, fmt.Errorf("destination %s: previous_secret_until: %q is not an RFC 3339 time (like 2026-12-31T00:00:00Z)", d.Name, v)
			}
		case "ca_file":
			if d.RootCAs, err = readCAFile(v); err != nil {
				return d, fmt.Errorf("destination %s: ca_file: %w", d.Name, err)
			}
		case "idempotent":
			if d.Idempotent, err = strconv.ParseBool(v); err != nil {
				return d, fmt.Errorf("destination %s: idempotent: %q is not true or false", d.Name, v)
			}
		case "retry_5xx":
			if d.Retry5xx, err = strconv.ParseBool(v); err != nil {
				return d, fmt.Errorf("destination %s: retry_5xx: %q is not true or false", d.Name, v)
			}
		case "timeout":
			if d.Timeout, err = time.ParseDuration(v); err != nil || d.Timeout <= 0 {
				return d, fmt.Errorf("destination %s: timeout: %q is not a positive duration", d.Name, v)
			}
		case "check_timeout":
			if d.CheckTimeout, err = time.ParseDuration(v); err != nil || d.CheckTimeout < time.Millisecond {
				return d, fmt.Errorf("destination %s: check_timeout: %q is not a duration of at least 1ms", d.Name, v)
			}
		case "breaker_failures":
			if d.BreakerFailures, err = strconv.Atoi(v); err != nil || d.BreakerFailures < 0 {
				return d, fmt.Errorf("destination %s: breaker_failures: %q is not a non-negative integer", d.Name, v)
			}
		case "breaker_cooldown":
			if d.BreakerCooldown, err = time.ParseDuration(v); err != nil || d.BreakerCooldown <= 0 {
				return d, fmt.Errorf("destination %s: breaker_cooldown: %q is not a positive duration", d.Name, v)
			}
		case "retry_inline":
			if d.RetryInline, err = time.ParseDuration(v); err != nil || d.RetryInline < 0 {
				return d, fmt.Errorf("destination %s: retry_inline: %q is not a duration of 0s or more", d.Name, v)
			}
			if d.RetryInline == 0 {
				d.RetryInline = -1 // none in line; 0 would take the default
			}
		case "concurrency":
			if d.Concurrency, err = strconv.Atoi(v); err != nil || d.Concurrency < 1 {
				return d, fmt.Errorf("destination %s: concurrency: %q is not a positive integer", d.Name, v)
			}
		case "rate":
			n, _ := strings.CutSuffix(v, "/s")
			if d.Rate, err = strconv.ParseFloat(n, 64); err != nil || d.Rate <= 0 {
				return d, fmt.Errorf("destination %s: rate: %q is not a positive number per second (like 50/s)", d.Name, v)
			}
		default:
			return d, fmt.Errorf("destination %s: unknown option %q (secret_env, previous_secret_env, previous_secret_until, ca_file, idempotent, retry_5xx, timeout, concurrency, rate, breaker_failures, breaker_cooldown, retry_inline, check_timeout, check)", d.Name, k)
		}
	}
	if !d.PreviousUntil.IsZero() && len(d.PreviousSecret) == 0 {
		return d, fmt.Errorf("destination %s: previous_secret_until: needs previous_secret_env", d.Name)
	}
	d.setDefaults()
	return d, d.validate()
}

// readCAFile reads a PEM file of CA certificates.
func readCAFile(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// ParseSecret decodes a Standard Webhooks secret "whsec_<base64>"; any
// other non-empty value is used as raw bytes.
func ParseSecret(s string) ([]byte, error) {
	if b64, ok := strings.CutPrefix(s, "whsec_"); ok {
		b, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(b) == 0 {
			return nil, fmt.Errorf("a whsec_ secret must be followed by base64")
		}
		return b, nil
	}
	if s == "" {
		return nil, fmt.Errorf("empty secret")
	}
	return []byte(s), nil
}
