package main

import (
	"io"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// secretEnv are the variables that hold credentials: their values are
// redacted from every output, whichever flag or library echoes them.
var secretEnv = []string{"ELASTICSEARCH_PASSWORD", "ELASTICSEARCH_API_KEY", "OUTBOXD_ADMIN_TOKEN"}

// secretFlags hold a credential as a whole; urlFlags may carry one in
// their userinfo or, for a DSN, in password=.
var (
	secretFlags = map[string]bool{"admin-token": true}
	urlFlags    = map[string]bool{"database-url": true, "elasticsearch-url": true, "api": true}
)

// minSecretLen: shorter values are not replaced verbatim, because that
// would mangle ordinary words; they are still caught where they sit in a
// URL's userinfo or a DSN's password=.
const minSecretLen = 4

var (
	urlPassword = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*):[^\s@/]*@`)
	dsnPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'"]+)`)
)

// redactor removes known secrets and URL or DSN passwords from text.
type redactor struct {
	mu      sync.RWMutex
	secrets map[string]bool
}

// secrets collects every credential this process has seen; main redacts
// its logs and errors with it.
var secrets = &redactor{secrets: map[string]bool{}}

// add remembers a secret, with the forms it takes once URL-escaped or
// quoted by a logger.
func (r *redactor) add(s string) {
	if len(s) < minSecretLen {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	q := strconv.Quote(s)
	for _, v := range []string{s, url.QueryEscape(s), url.PathEscape(s), q[1 : len(q)-1]} {
		r.secrets[v] = true
	}
}

// addURL remembers the password of a URL (or each of a comma-separated
// list) or of a key=value DSN.
func (r *redactor) addURL(s string) {
	for _, part := range strings.Split(s, ",") {
		if u, err := url.Parse(strings.TrimSpace(part)); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok {
				r.add(p)
			}
		}
	}
	for _, m := range dsnPassword.FindAllStringSubmatch(s, -1) {
		r.add(strings.Trim(m[2], "'"))
	}
}

// addEnv remembers the credentials the environment holds.
func (r *redactor) addEnv() {
	for _, k := range secretEnv {
		r.add(os.Getenv(k))
	}
	for _, k := range []string{"DATABASE_URL", "ELASTICSEARCH_URL", "OUTBOXD_DATABASE_URL", "OUTBOXD_ELASTICSEARCH_URL", "OUTBOXD_API_URL", "OUTBOXD_API"} {
		r.addURL(os.Getenv(k))
	}
}

// String returns s with every known secret and every URL or DSN password
// replaced by xxxxx (as url.URL.Redacted does).
func (r *redactor) String(s string) string {
	s = urlPassword.ReplaceAllString(s, "$1:xxxxx@")
	s = dsnPassword.ReplaceAllString(s, "${1}xxxxx")
	r.mu.RLock()
	known := make([]string, 0, len(r.secrets))
	for v := range r.secrets {
		known = append(known, v)
	}
	r.mu.RUnlock()
	// Longest first, so a secret that contains another goes whole.
	sort.Slice(known, func(i, j int) bool { return len(known[i]) > len(known[j]) })
	for _, v := range known {
		s = strings.ReplaceAll(s, v, "xxxxx")
	}
	return s
}

// redactWriter redacts each Write. Loggers and fmt write a record or a
// message per call, so a secret is never split across two.
type redactWriter struct {
	w io.Writer
	r *redactor
}

func (w redactWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(w.w, w.r.String(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// addDestination remembers what of a --destination value's URL may be a
// credential: its userinfo password, path and query, and the query
// values and token-like path segments in them (webhook URLs such as
// https://hooks.slack.com/services/T000/B000/XXXX carry their secret
// there).
func (r *redactor) addDestination(spec string) {
	_, rest, _ := strings.Cut(spec, "=")
	raw, _, _ := strings.Cut(rest, ",")
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return
	}
	if u.User != nil {
		if p, ok := u.User.Password(); ok {
			r.add(p)
		}
	}
	if u.Path != "/" {
		r.add(u.Path)
		r.add(u.EscapedPath())
	}
	r.add(u.RawQuery)
	r.add(u.Fragment)
	for _, vs := range u.Query() {
		for _, v := range vs {
			r.add(v)
		}
	}
	for _, seg := range strings.Split(u.Path, "/") {
		if len(seg) >= 8 && strings.ContainsAny(seg, "0123456789") {
			r.add(seg)
		}
	}
}
