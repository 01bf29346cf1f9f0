package main

import (
	"strings"
	"testing"
)

func TestRedactor(t *testing.T) {
	t.Parallel()
	r := &redactor{secrets: map[string]bool{}}
	r.add("tok3n/with spaces\"")
	r.add("pw") // too short to replace verbatim
	r.addURL("postgres://u:p%40ss-word@db/x, http://e:es-url-pw@es:9200")
	r.addURL("host=db password='dsn pw 1' user=u")
	for _, c := range []struct{ in, want string }{
		{"connect postgres://user:pw@host:5432/db?sslmode=disable failed", "connect postgres://user:xxxxx@host:5432/db?sslmode=disable failed"},
		{"Post \"http://carol:pw@127.0.0.1:1/api\": refused", "Post \"http://carol:xxxxx@127.0.0.1:1/api\": refused"},
		{"host=db port=1 password=pw user=u", "host=db port=1 password=xxxxx user=u"},
		{"host=db Password = 'a b' user=u", "host=db Password = xxxxx user=u"},
		{"http://es:9200/_bulk?q=a@b", "http://es:9200/_bulk?q=a@b"},
		{`token "tok3n/with spaces\""`, `token "xxxxx"`},
		{"escaped tok3n%2Fwith+spaces%22", "escaped xxxxx"},
		{"url password p@ss-word, escaped p%40ss-word", "url password xxxxx, escaped xxxxx"},
		{"echoed es-url-pw and dsn pw 1", "echoed xxxxx and xxxxx"},
		{"a pw of two letters stays in prose", "a pw of two letters stays in prose"},
	} {
		if got := r.String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	var b strings.Builder
	w := redactWriter{w: &b, r: r}
	line := []byte("level=ERROR err=\"dial http://e:es-url-pw@es\"\n")
	if n, err := w.Write(line); err != nil || n != len(line) {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if got := b.String(); strings.Contains(got, "es-url-pw") {
		t.Fatalf("the writer let the secret through: %q", got)
	}
}

func TestRedactorDestinationURL(t *testing.T) {
	t.Parallel()
	r := &redactor{secrets: map[string]bool{}}
	r.addDestination("slack=https://hooks.slack.com/services/T000/B000SECRET99/XXXXSECRET?token=QUERYTOKEN1,secret_env=S")
	got := r.String(`Post "https://hooks.slack.com/services/T000/B000SECRET99/XXXXSECRET?token=QUERYTOKEN1": refused; echoed B000SECRET99 and QUERYTOKEN1`)
	for _, s := range []string{"B000SECRET99", "XXXXSECRET", "QUERYTOKEN1"} {
		if strings.Contains(got, s) {
			t.Fatalf("%q shows %q", got, s)
		}
	}
	if !strings.Contains(got, "https://hooks.slack.com") {
		t.Fatalf("the host is lost: %q", got)
	}
}

// The relay's flags feed the redactor: whatever echoes a --destination
// URL later (a library's error, a log line) loses its path and query.
func TestRelayFlagsRedactDestinationURLs(t *testing.T) {
	t.Parallel()
	const token = "TOKEN0000secret777"
	_, _, _, err := parseRelayFlags([]string{"--destination", "slack=https://hooks.slack.com/services/T000/B000/" + token + ",secret_env=UNSET_ANYWHERE_X",
		"--database-url", "postgres://localhost/x"})
	if err != nil {
		t.Fatal(err)
	}
	if got := secrets.String(`Post "https://hooks.slack.com/services/T000/B000/` + token + `": EOF`); strings.Contains(got, token) {
		t.Fatalf("not redacted: %s", got)
	}
}
