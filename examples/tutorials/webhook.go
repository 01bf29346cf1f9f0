package main

import (
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/webhook"
)

// receive is a webhook receiver (POST /api/webhooks/{source}): it checks the
// Standard Webhooks signature, then records the message in the inbox by
// its Idempotency-Key and applies its effect (a notifications row) in one
// transaction. A repeat answers 200 without a second effect, so senders
// may retry freely; outboxd can then run this destination with
// idempotent=true.
func (s *Server) receive(w http.ResponseWriter, r *http.Request) {
	if len(s.webhookSecret) == 0 {
		writeError(w, &APIError{Status: http.StatusNotFound, Message: "no webhook secret is configured"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		writeError(w, &APIError{Status: http.StatusRequestEntityTooLarge, Field: "body", Message: "at most 1 MiB"})
		return
	}
	if err := webhook.Verify(s.webhookSecret, r.Header, body, time.Now(), 0); err != nil {
		writeError(w, &APIError{Status: http.StatusUnauthorized, Message: err.Error()})
		return
	}
	source, key := r.PathValue("source"), r.Header.Get(webhook.HeaderIdempotencyKey)
	if key == "" {
		key = r.Header.Get(webhook.HeaderID)
	}
	if key == "" {
		writeError(w, &APIError{Status: http.StatusBadRequest, Field: "Idempotency-Key", Message: "required"})
		return
	}
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
