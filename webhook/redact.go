package webhook

import (
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// Webhook URLs often carry their credential in the path or the query
// (https://hooks.slack.com/services/T000/B000/XXXX, ?token=...), so a
// destination's URL is shown only as scheme://host[:port]/…: the name of
// the destination says which one it is.

// RedactURL returns raw with its userinfo, path, query and fragment
// replaced by "…"; an unparsable value becomes "(invalid URL)".
func RedactURL(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "(invalid URL)"
	}
	out := u.Scheme + "://" + u.Host
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		out += "/…"
	}
	return out
}

// minSecretPart: path segments and query values shorter than this are
// ordinary words ("services", "v1" survive only when short); longer ones
// may be a token and are replaced wherever they appear.
const minSecretPart = 6

// Redact replaces every trace of the destination's URL in s (the whole
// URL in any quoting, its path, query, and their long parts, as a
// receiver may echo them in an error page) with its redacted form. Every
// reason the sink records or logs passes through it.
func (d Destination) Redact(s string) string {
	if d.URL == "" || s == "" {
		return s
	}
	return redactParts(s, urlParts(d.URL), RedactURL(d.URL))
}

// urlParts lists the forms in which raw, or its secret-bearing parts,
// may appear in a message, longest first.
func urlParts(raw string) []string {
	parts := map[string]bool{raw: true}
	q := strconv.Quote(raw)
	parts[q[1:len(q)-1]] = true
	if u, err := url.Parse(raw); err == nil {
		parts[u.String()] = true
		parts[u.Redacted()] = true
		for _, p := range []string{u.Path, u.EscapedPath(), u.RawQuery, u.Fragment, u.Opaque} {
			if p != "" && p != "/" {
				parts[p] = true
			}
		}
		for _, seg := range strings.Split(u.Path, "/") {
			if len(seg) >= minSecretPart {
				parts[seg] = true
				parts[url.PathEscape(seg)] = true
			}
		}
		for _, vs := range u.Query() {
			for _, v := range vs {
				if len(v) >= minSecretPart {
					parts[v] = true
					parts[url.QueryEscape(v)] = true
				}
			}
		}
		if u.User != nil {
			if p, ok := u.User.Password(); ok && p != "" {
				parts[p] = true
			}
		}
	}
	out := make([]string, 0, len(parts))
	for p := range parts {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func redactParts(s string, parts []string, with string) string {
	for i, p := range parts {
		if i == 0 {
			s = strings.ReplaceAll(s, p, with) // the whole URL reads as its redacted form
			continue
		}
		s = strings.ReplaceAll(s, p, "…")
	}
	return s
}
