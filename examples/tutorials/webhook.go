package main

import (
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/inbox"
)

// WebhookSource is the inbox source of the messages that the configured
// secret verifies: the outboxd relay that signs them.
const WebhookSource = "outboxd"

func webhookSenders(cfg Config) []inbox.Sender {
	if len(cfg.WebhookSecret) == 0 {
		return nil
	}
	return []inbox.Sender{{Source: WebhookSource, Secrets: [][]byte{cfg.WebhookSecret, cfg.WebhookPreviousSecret}}}
}

// receive is a webhook receiver (POST /api/webhooks): it checks the
// Standard Webhooks signature, then records the message in the inbox by
// its webhook-id (the signed key) under the source whose secret verified
// it, and applies its effect (a notifications row) in one transaction.
// Neither the URL path nor an Idempotency-Key header is signed, so
// neither takes part: a captured request replayed with another path or
// header is still one message. A repeat answers 200 without a second
// effect, so senders may retry freely; outboxd can then run this
// destination with idempotent=true.
func (s *Server) receive(w http.ResponseWriter, r *http.Request) {
	if len(s.senders) == 0 {
		writeError(w, &APIError{Status: http.StatusNotFound, Message: "no webhook secret is configured"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		writeError(w, &APIError{Status: http.StatusRequestEntityTooLarge, Field: "body", Message: "at most 1 MiB"})
		return
	}
	msg, err := inbox.Verify(s.senders, r.Header, body, time.Now())
	if err != nil {
		writeError(w, &APIError{Status: http.StatusUnauthorized, Message: err.Error()})
		return
	}
	source, key := msg.Source, msg.Key
	var first bool
	err = pgx.BeginFunc(r.Context(), s.pool, func(tx pgx.Tx) error {
		var err error
		if first, err = inbox.ReceiveIn(r.Context(), tx, s.outbox.SchemaName(), source, key); err != nil || !first {
			return err
		}
		_, err = tx.Exec(r.Context(), `INSERT INTO `+s.notifications+` (source, key, payload) VALUES ($1, $2, $3)`, source, key, string(body))
		return err
	})
	var pgErr interface{ SQLState() string }
	switch {
	case errors.As(err, &pgErr) && pgErr.SQLState()[:2] == "22":
		writeError(w, &APIError{Status: http.StatusBadRequest, Field: "body", Message: "must be a JSON document"})
	case err != nil:
		s.log.Error("webhook receive failed", "source", source, "err", err)
		writeError(w, &APIError{Status: http.StatusServiceUnavailable, Message: "try again"})
	case first:
		writeJSON(w, http.StatusOK, map[string]string{"status": "received"})
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "duplicate"})
	}
}
