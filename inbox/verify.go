package inbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/webhook"
)

// Sender is one sender a receiver accepts: Source names it in the inbox,
// Secrets verify its requests (the new and the old one while it rotates).
type Sender struct {
	Source  string
	Secrets [][]byte
}

// Signed is a request whose Standard Webhooks signature verified. Its key
// is the webhook-id header and its source the sender whose secret
// verified it: both come from what the signature covers (webhook-id) or
// proves (the secret), never from a header or a URL path that anyone
// replaying a captured request may change.
type Signed struct {
	Source string
	Key    string
	Body   []byte
}

// ErrNotSigned is returned by Verify for a request that no sender's
// secret verifies.
var ErrNotSigned = errors.New("inbox: no sender's secret verifies the request")

// Verify checks a received request against every sender's secrets (and the
// timestamp against now, with webhook.Verify's tolerance) and returns what
// the inbox may trust of it.
func Verify(senders []Sender, h http.Header, body []byte, now time.Time) (Signed, error) {
	var lastErr error = ErrNotSigned
	for _, s := range senders {
		_, err := webhook.VerifyAny(s.Secrets, h, body, now, 0)
		if err == nil {
			return Signed{Source: s.Source, Key: h.Get(webhook.HeaderID), Body: body}, nil
		}
		if !errors.Is(err, webhook.ErrSignature) {
			return Signed{}, fmt.Errorf("inbox: %w", err) // the headers themselves are wrong
		}
	}
	return Signed{}, lastErr
}

// ReceiveSigned records a verified request in the default schema's inbox
// and reports whether this is its first delivery.
func ReceiveSigned(ctx context.Context, tx Querier, m Signed) (first bool, err error) {
	return ReceiveIn(ctx, tx, schema.DefaultName, m.Source, m.Key)
}
