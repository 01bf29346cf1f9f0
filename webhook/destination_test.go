package webhook_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/webhook"
)

func TestParseDestination(t *testing.T) {
	t.Parallel()
	env := map[string]string{"HOOK_SECRET": "whsec_c2VjcmV0LXZhbHVl", "RAW": "raw-secret-value"}
	getenv := func(k string) string { return env[k] }

	t.Run("every option is read, and check takes the rest of the value, commas included", func(t *testing.T) {
		d, err := webhook.ParseDestination("billing=https://b.example/hook,secret_env=HOOK_SECRET,idempotent=true,timeout=2s,concurrency=3,rate=50/s,check=SELECT $1 <> '', true", getenv)
		if err != nil {
			t.Fatal(err)
		}
		if d.Name != "billing" || d.URL != "https://b.example/hook" || string(d.Secret) != "secret-value" || !d.Idempotent ||
			d.Timeout != 2*time.Second || d.Concurrency != 3 || d.Rate != 50 || d.Check != "SELECT $1 <> '', true" {
			t.Fatalf("got %+v", d)
		}
		if s := d.String(); strings.Contains(s, "secret-value") || strings.Contains(s, "c2VjcmV0") {
			t.Fatalf("String() shows the secret: %s", s)
		}
	})

	t.Run("retry_inline bounds the in-line retries: 5s by default, 0s parks at the first retry", func(t *testing.T) {
		for spec, want := range map[string]time.Duration{
			"b=http://x,secret_env=RAW":                    webhook.DefaultRetryInline,
			"b=http://x,secret_env=RAW,retry_inline=750ms": 750 * time.Millisecond,
			"b=http://x,secret_env=RAW,retry_inline=0s":    -1,
		} {
			d, err := webhook.ParseDestination(spec, getenv)
			if err != nil || d.RetryInline != want {
				t.Errorf("%q: retry_inline %s (%v), want %s", spec, d.RetryInline, err, want)
			}
		}
	})

	t.Run("bad values are refused naming the option and the reason, never the secret", func(t *testing.T) {
		for spec, want := range map[string]string{
			"billing":                                            "want NAME=URL",
			"Billing=http://x,secret_env=RAW":                    "destination",
			"b=ftp://x,secret_env=RAW":                           "url:",
			"b=http://x":                                         "secret: required",
			"b=http://x,secret_env=MISSING":                      "environment variable MISSING is not set",
			"b=http://x,secret_env=RAW,timeout=soon":             "timeout:",
			"b=http://x,secret_env=RAW,concurrency=0":            "concurrency:",
			"b=http://x,secret_env=RAW,rate=fast":                "rate:",
			"b=http://x,secret_env=RAW,idempotent=maybe":         "idempotent:",
			"b=http://x,secret_env=RAW,colour=blue":              `unknown option "colour"`,
			"b=http://x,secret_env=RAW,check=":                   "check: empty",
			"b=http://x,secret_env=RAW,retry_inline=-1s":         "retry_inline:",
			"b=http://x,secret_env=HOOK_SECRET,timeout=-1s,":     "timeout:",
			"b=http://x,secret_env=RAW,secret_env=HOOK_SECRET,x": "want option=value",
		} {
			_, err := webhook.ParseDestination(spec, getenv)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%q: want an error containing %q, got %v", spec, want, err)
			}
			if err != nil && (strings.Contains(err.Error(), "raw-secret-value") || strings.Contains(err.Error(), "c2VjcmV0")) {
				t.Errorf("%q: the error shows the secret: %v", spec, err)
			}
		}
	})

	t.Run("a signature made with one secret verifies only with it, and only for that body", func(t *testing.T) {
		h := http.Header{}
		now := time.Now()
		h.Set(webhook.HeaderID, "msg-1")
		h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
		h.Set(webhook.HeaderSignature, "v1,bogus "+webhook.Sign([]byte("k"), "msg-1", now.Unix(), []byte(`{"a":1}`)))
		if err := webhook.Verify([]byte("k"), h, []byte(`{"a":1}`), now, 0); err != nil {
			t.Fatalf("a rotated-in signature list did not verify: %v", err)
		}
		if err := webhook.Verify([]byte("k"), h, []byte(`{"a":2}`), now, 0); err != webhook.ErrSignature {
			t.Fatalf("another body verified: %v", err)
		}
	})
}
