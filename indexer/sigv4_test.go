package indexer

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/outboxd/outboxd/schema/schematest"
)

// No AWS endpoint is reachable from the tests: the signatures are checked
// by verifySigV4, the algorithm as AWS documents it ("Create a signed AWS
// API request": canonical request, string to sign, derived signing key),
// written here independently of the SDK that signs.

const (
	testAccessKey = "AKIDEXAMPLE"
	testSecretKey = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
)

func testAWS(service string) *AWSSigning {
	return &AWSSigning{Region: "eu-west-1", Service: service, Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{AccessKeyID: testAccessKey, SecretAccessKey: testSecretKey, SessionToken: "session-token"}, nil
	})}
}

func hmacSHA256(key []byte, s string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(s))
	return m.Sum(nil)
}

// rfc3986 escapes as SigV4's canonical query wants: every byte but
// A-Z a-z 0-9 - _ . ~ percent-encoded, spaces as %20.
func rfc3986(s string) string {
	return strings.ReplaceAll(url.QueryEscape(s), "+", "%20")
}

// verifySigV4 checks r's Authorization header against the body it
// carries, for the test key, region and service.
func verifySigV4(r *http.Request, body []byte, region, service string) error {
	auth := r.Header.Get("Authorization")
	const algo = "AWS4-HMAC-SHA256 "
	if !strings.HasPrefix(auth, algo) {
		return fmt.Errorf("authorization %q: not AWS4-HMAC-SHA256", auth)
	}
	fields := map[string]string{}
	for _, f := range strings.Split(strings.TrimPrefix(auth, algo), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(f), "=")
		fields[k] = v
	}
	date := r.Header.Get("X-Amz-Date")
	if len(date) != len("20060102T150405Z") {
		return fmt.Errorf("x-amz-date %q", date)
	}
	scope := date[:8] + "/" + region + "/" + service + "/aws4_request"
	if fields["Credential"] != testAccessKey+"/"+scope {
		return fmt.Errorf("credential %q, want scope %s", fields["Credential"], scope)
	}
	sum := sha256.Sum256(body)
	payload := hex.EncodeToString(sum[:])
	if got := r.Header.Get("X-Amz-Content-Sha256"); got != payload {
		return fmt.Errorf("x-amz-content-sha256 %q, body hashes to %s", got, payload)
	}
	// Canonical query: keys and values escaped, sorted by key then value.
	var query []string
	for k, vs := range r.URL.Query() {
		for _, v := range vs {
			query = append(query, rfc3986(k)+"="+rfc3986(v))
		}
	}
	sort.Strings(query)
	signedHeaders := strings.Split(fields["SignedHeaders"], ";")
	if !sort.StringsAreSorted(signedHeaders) || !strings.Contains(fields["SignedHeaders"], "host") || !strings.Contains(fields["SignedHeaders"], "x-amz-date") || !strings.Contains(fields["SignedHeaders"], "x-amz-content-sha256") {
		return fmt.Errorf("signed headers %q", fields["SignedHeaders"])
	}
	var headers strings.Builder
	for _, h := range signedHeaders {
		var v string
		switch h {
		case "host":
			v = r.Host
		case "content-length":
			v = strconv.FormatInt(r.ContentLength, 10)
		default:
			v = strings.Join(r.Header.Values(h), ",")
		}
		headers.WriteString(h + ":" + strings.Join(strings.Fields(v), " ") + "\n")
	}
	// Canonical URI: every segment of the path as sent, URI-encoded again
	// (all services but S3 encode twice).
	segs := strings.Split(r.URL.EscapedPath(), "/")
	for i := range segs {
		segs[i] = rfc3986(segs[i])
	}
	path := strings.Join(segs, "/")
	if path == "" {
		path = "/"
	}
	canonical := strings.Join([]string{r.Method, path, strings.Join(query, "&"), headers.String(), fields["SignedHeaders"], payload}, "\n")
	crSum := sha256.Sum256([]byte(canonical))
	toSign := "AWS4-HMAC-SHA256\n" + date + "\n" + scope + "\n" + hex.EncodeToString(crSum[:])
	key := hmacSHA256([]byte("AWS4"+testSecretKey), date[:8])
	key = hmacSHA256(key, region)
	key = hmacSHA256(key, service)
	key = hmacSHA256(key, "aws4_request")
	if want := hex.EncodeToString(hmacSHA256(key, toSign)); !hmac.Equal([]byte(want), []byte(fields["Signature"])) {
		return fmt.Errorf("signature %s, want %s for the canonical request\n%s", fields["Signature"], want, canonical)
	}
	if r.Header.Get("X-Amz-Security-Token") != "session-token" {
		return fmt.Errorf("x-amz-security-token %q", r.Header.Get("X-Amz-Security-Token"))
	}
	return nil
}

// sigV4Proxy verifies every request's signature and forwards only
// verified ones to the test server; it answers 403 like AWS otherwise.
func sigV4Proxy(t *testing.T, service string) (url string, verified, refused *atomic.Int64) {
	t.Helper()
	target, err := urlParse(schematest.ElasticsearchURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	verified, refused = new(atomic.Int64), new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := verifySigV4(r, body, "eu-west-1", service); err != nil {
			refused.Add(1)
			t.Errorf("%s %s: %v", r.Method, r.URL, err)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"message":"The request signature we calculated does not match the signature you provided."}`)
			return
		}
		verified.Add(1)
		for _, h := range []string{"Authorization", "X-Amz-Date", "X-Amz-Content-Sha256", "X-Amz-Security-Token"} {
			r.Header.Del(h)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, verified, refused
}

func urlParse(s string) (*url.URL, error) { return url.Parse(SplitAddresses(s)[0]) }

func TestSigV4Signing(t *testing.T) {
	t.Parallel()

	for _, service := range []string{"es", "aoss"} {
		t.Run("every request of a sink's writes is signed for "+service+" with its payload hash, and the events apply", func(t *testing.T) {
			t.Parallel()
			es, name := setup(t)
			u, verified, refused := sigV4Proxy(t, service)
			signed, err := NewClient(ClientConfig{Addresses: []string{u}, AWS: testAWS(service), Timeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			s := newSink(t, Options{Client: signed})
			if got := statuses(mustWrite(t, s, upsert(name, "a", 1, `{"t":"x y"}`), upsert(name, "b", 2, `{}`), del(name, "b", 3))); got != "applied stale applied" { // b@2 gives way to its delete in the same write
				t.Fatalf("got %s", got)
			}
			if got := statuses(mustWrite(t, s, upsert(name, "a", 1, `{"t":"x y"}`))); got != "stale" {
				t.Fatalf("replay: got %s", got)
			}
			if docs := searchRead(t, es, name); len(docs) != 1 || docs["a"] == nil {
				t.Fatalf("read alias: %v", docs)
			}
			if verified.Load() < 4 || refused.Load() != 0 {
				t.Fatalf("%d requests verified, %d refused", verified.Load(), refused.Load())
			}
		})
	}

	t.Run("a body or a header changed after signing fails verification", func(t *testing.T) {
		t.Parallel()
		var got *http.Request
		var gotBody []byte
		tr := newSigV4Transport(*testAWS("es"), roundTripFunc(func(r *http.Request) (*http.Response, error) {
			got = r
			gotBody, _ = io.ReadAll(r.Body)
			return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}}, nil
		}))
		req, _ := http.NewRequest("POST", "http://search.example:443/_bulk?filter_path=items.*.status,errors&require_alias=true", strings.NewReader(`{"index":{"_index":"n","_id":"a"}}`+"\n{}\n"))
		req.Header.Set("Content-Type", "application/x-ndjson")
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		if err := verifySigV4(got, gotBody, "eu-west-1", "es"); err != nil {
			t.Fatalf("as signed: %v", err)
		}
		if err := verifySigV4(got, append(gotBody, ' '), "eu-west-1", "es"); err == nil {
			t.Fatal("a changed body verified")
		}
		got.Header.Set("Content-Type", "application/json")
		if err := verifySigV4(got, gotBody, "eu-west-1", "es"); err == nil {
			t.Fatal("a changed signed header verified")
		}
	})

	t.Run("bad settings are refused naming the field and the secrets never show", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			cfg  ClientConfig
			want string
		}{
			{ClientConfig{Addresses: []string{"http://x"}, AWS: &AWSSigning{Service: "es", Credentials: testAWS("es").Credentials}}, "aws region: not set"},
			{ClientConfig{Addresses: []string{"http://x"}, AWS: &AWSSigning{Region: "eu-west-1", Service: "s3", Credentials: testAWS("es").Credentials}}, `aws service: want es (OpenSearch Service) or aoss (OpenSearch Serverless), got "s3"`},
			{ClientConfig{Addresses: []string{"http://x"}, Username: "u", Password: "secret", AWS: testAWS("es")}, "cannot be combined with ELASTICSEARCH_USERNAME"},
		} {
			_, err := NewClient(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "secret") {
				t.Errorf("NewClient: %v, want %q", err, c.want)
			}
		}
		if s := (ClientConfig{Addresses: []string{"https://d.eu-west-1.es.amazonaws.com"}, AWS: testAWS("es")}).String(); s != "addresses=https://d.eu-west-1.es.amazonaws.com auth=aws-sigv4(es,eu-west-1)" {
			t.Errorf("String: %s", s)
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
