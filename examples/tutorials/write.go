package main

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// result is what a business operation answers; it is sent and stored.
type result struct {
	status   int
	body     any
	resource string // tutorial id, for Location on creates
}

// operation is the business part of a write. It runs inside the
// transaction that also completes the idempotency key. Returning an
// *APIError (404, 403) rolls the transaction back and marks the key FAILED.
type operation func(ctx context.Context, tx pgx.Tx) (result, error)

// idempotent runs op at most once per (user, Idempotency-Key, payload).
//
// The claim commits first, on its own, so concurrent duplicates see
// PROCESSING and get 409 at once. The business row, its outbox event and
// the key's SUCCESS with the stored response then commit in one
// transaction: after a crash either all three exist (a retry replays the
// response) or none does (the claim's lease runs out and a retry takes it
// over).
func (s *Server) idempotent(w http.ResponseWriter, r *http.Request, user, key string, payload []byte, op operation) {
	norm, err := normalize(payload)
	if err != nil {
		writeError(w, &APIError{Status: http.StatusBadRequest, Message: "invalid JSON: " + err.Error()})
		return
	}
	hash := requestHash(r.Method, r.URL.Path, norm)
	// The write must finish or fail on its own terms even if the client
	// hangs up, or its key would sit in PROCESSING until the lease ends.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.keys.lease)
	defer cancel()

	c, err := s.keys.Claim(ctx, user, key, r.Method, r.URL.Path, hash)
	if err != nil {
		s.internal(w, r, "claim idempotency key", err)
		return
	}
	if c.duplicate {
		s.metrics.duplicates.Inc()
	}
	switch c.kind {
	case replay:
		s.metrics.keyHits.Inc()
		w.Header().Set(HeaderReplayed, "true")
		writeResult(w, c.status, c.resource, c.body)
		return
	case payloadConflict:
		s.metrics.payloadConflicts.Inc()
		writeError(w, &APIError{Status: http.StatusConflict, Field: HeaderIdempotencyKey,
			Message: "this key was already used for a different request (method, path or payload differ); use a new key for a new operation"})
		return
	case busy:
		s.metrics.busy.Inc()
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Max(1, math.Ceil(c.retryIn.Seconds())))))
		writeError(w, &APIError{Status: http.StatusConflict, Field: HeaderIdempotencyKey,
			Message: "a request with this key is still being processed; retry later with the same key and payload"})
		return
	}

	res, body, err := s.commit(ctx, user, key, c.token, op)
	var apiErr *APIError
	switch {
	case errors.Is(err, ErrLeaseLost):
		writeError(w, &APIError{Status: http.StatusConflict, Field: HeaderIdempotencyKey,
			Message: "this request took too long and another request with the same key took over; retry with the same key"})
		return
	case errors.As(err, &apiErr):
		b, _ := json.Marshal(apiErr)
		if ferr := s.keys.fail(ctx, user, key, c.token, apiErr.Status, b); ferr != nil {
			s.log.Error("mark idempotency key failed", "user", user, "err", ferr)
		}
		writeError(w, apiErr)
		return
	case err != nil:
		b := []byte(`{"error":"internal error; nothing was written, retry with the same key"}`)
		if ferr := s.keys.fail(ctx, user, key, c.token, http.StatusInternalServerError, b); ferr != nil {
			s.log.Error("mark idempotency key failed", "user", user, "err", ferr)
		}
		s.log.Error("write failed", "method", r.Method, "path", r.URL.Path, "user", user, "err", err)
		writeRaw(w, http.StatusInternalServerError, b)
		return
	}
	if s.afterCommit != nil {
		s.afterCommit(r)
	}
	writeResult(w, res.status, res.resource, body)
}

// writeResult sends a write's response, fresh or replayed; a create's
// carries the new tutorial's Location.
func writeResult(w http.ResponseWriter, status int, resource string, body []byte) {
	if resource != "" && status == http.StatusCreated {
		w.Header().Set("Location", "/api/tutorials/"+resource)
	}
	writeRaw(w, status, body)
}

// commit runs op and completes the key in one transaction.
func (s *Server) commit(ctx context.Context, user, key, token string, op operation) (result, []byte, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return result{}, nil, err
	}
	defer tx.Rollback(ctx)
	if err := s.keys.hold(ctx, tx, user, key, token); err != nil {
		return result{}, nil, err
	}
	res, err := op(ctx, tx)
	if err != nil {
		return result{}, nil, err
	}
	body, err := json.Marshal(res.body)
	if err != nil {
		return result{}, nil, err
	}
	if err := s.keys.succeed(ctx, tx, user, key, token, res.status, body, res.resource); err != nil {
		return result{}, nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return result{}, nil, err
	}
	return res, body, nil
}

func (s *Server) internal(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.log.Error(what, "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, &APIError{Status: http.StatusInternalServerError, Message: what + " failed; retry with the same key"})
}
