package indexer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// AWSSigning signs every request with AWS Signature Version 4, for Amazon
// OpenSearch Service (Service "es", a domain) and OpenSearch Serverless
// ("aoss", a collection). Credentials come from the caller (a command
// loads the SDK's default chain: environment, shared config, web identity,
// container and instance roles); the SDK's signer does the signing.
type AWSSigning struct {
	Region      string
	Service     string // "es" or "aoss"
	Credentials aws.CredentialsProvider
}

func (a *AWSSigning) check(c ClientConfig) error {
	switch {
	case a.Region == "":
		return fmt.Errorf("indexer: aws region: not set (SigV4 signing needs the region of the domain, e.g. eu-west-1)")
	case a.Service != "es" && a.Service != "aoss":
		return fmt.Errorf("indexer: aws service: want es (OpenSearch Service) or aoss (OpenSearch Serverless), got %q", a.Service)
	case a.Credentials == nil:
		return fmt.Errorf("indexer: aws credentials: none given")
	case c.Username != "" || c.Password != "" || c.APIKey != "":
		// Both would be an Authorization header; the signature must win.
		return fmt.Errorf("indexer: aws sigv4: cannot be combined with ELASTICSEARCH_USERNAME, ELASTICSEARCH_PASSWORD or ELASTICSEARCH_API_KEY")
	}
	return nil
}

// sigv4Transport signs each request as it leaves, below the client (which
// has set every header by then) and above the deadline, so a slow
// credential refresh counts against the request's timeout too. The
// payload is hashed (X-Amz-Content-Sha256, which OpenSearch Serverless
// requires), so a body changed on the way fails the signature.
type sigv4Transport struct {
	sign   AWSSigning
	signer *v4.Signer
	next   http.RoundTripper
	now    func() time.Time
}

func newSigV4Transport(a AWSSigning, next http.RoundTripper) *sigv4Transport {
	return &sigv4Transport{sign: a, signer: v4.NewSigner(), next: next, now: time.Now}
}

func (s *sigv4Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		var err error
		body, err = io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("aws sigv4: reading the request body: %w", err)
		}
	}
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	signed := req.Clone(req.Context())
	signed.Body = io.NopCloser(bytes.NewReader(body))
	signed.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	signed.ContentLength = int64(len(body))
	signed.Header.Set("X-Amz-Content-Sha256", hash)
	creds, err := s.sign.Credentials.Retrieve(req.Context())
	if err != nil {
		return nil, fmt.Errorf("aws sigv4: credentials: %w", err)
	}
	if err := s.signer.SignHTTP(req.Context(), creds, signed, hash, s.sign.Service, s.sign.Region, s.now()); err != nil {
		return nil, fmt.Errorf("aws sigv4: signing: %w", err)
	}
	return s.next.RoundTrip(signed)
}
