package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks headers (https://www.standardwebhooks.com).
const (
	HeaderID             = "webhook-id"
	HeaderTimestamp      = "webhook-timestamp"
	HeaderSignature      = "webhook-signature"
	HeaderIdempotencyKey = "Idempotency-Key"
)

// Sign returns the webhook-signature value for one request:
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>".
func Sign(secret []byte, id string, timestamp int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(timestamp, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// signature is the webhook-signature header of one request to d: signed
// with its secret and, during a rotation's grace window, with the
// previous one too, space-separated.
func (d *Destination) signature(id string, timestamp int64, body []byte, now time.Time) string {
	sig := Sign(d.Secret, id, timestamp, body)
	if len(d.PreviousSecret) > 0 && (d.PreviousUntil.IsZero() || now.Before(d.PreviousUntil)) {
		sig += " " + Sign(d.PreviousSecret, id, timestamp, body)
	}
	return sig
}

// ErrSignature is returned by Verify for a request that was not signed
// with the secret (or was changed after signing).
var ErrSignature = errors.New("webhook: signature does not match")

// Verify checks a received request's Standard Webhooks headers against
// secret and the raw body, and that its timestamp is within tolerance of
// now (replay protection; 5 minutes when tolerance is 0).
func Verify(secret []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	_, err := VerifyAny([][]byte{secret}, h, body, now, tolerance)
	return err
}

// VerifyAny is Verify with several secrets (a sender rotating its secret
// is accepted under the new and the old one): it returns the index of the
// first secret that verifies the request.
func VerifyAny(secrets [][]byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) (int, error) {
	if tolerance <= 0 {
		tolerance = 5 * time.Minute
	}
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return -1, errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return -1, errors.New("webhook: webhook-timestamp is not a number")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return -1, errors.New("webhook: webhook-timestamp is outside the tolerance")
	}
	for i, secret := range secrets {
		if len(secret) == 0 {
			continue
		}
		want := []byte(Sign(secret, id, sec, body))
		// Several space-separated signatures are allowed while a secret rotates.
		for _, s := range strings.Fields(sigs) {
			if hmac.Equal([]byte(s), want) {
				return i, nil
			}
		}
	}
	return -1, ErrSignature
}
