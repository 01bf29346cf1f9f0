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
// transaction that also claims and completes the idempotency key.
// Returning an *APIError (404, 403) rolls the operation back and marks the
// key FAILED.
type operation func(ctx context.Context, tx pgx.Tx) (result, error)

// idempotent runs op at most once per (user, Idempotency-Key, payload).
//
// The claim, the business row, its outbox event and the key's SUCCESS with
// the stored response commit in one transaction, whose advisory lock on
// the key answers concurrent duplicates 409 at once. However the request
// ends, either all of it exists (a retry replays the response) or none of
// it does (a retry runs at once): a request cut off by a database restart
// or a lost connection leaves no claim behind.
func (s *Server) idempotent(w http.ResponseWriter, r *http.Request, user, key string, payload []byte, op operation) {
	norm, err := normalize(payload)
	if err != nil {
		writeError(w, &APIError{Status: http.StatusBadRequest, Message: "invalid JSON: " + err.Error()})
		return
	}
	hash := requestHash(r.Method, r.URL.Path, norm)
	// The write must finish or fail on its own terms even if the client
	// hangs up, so a retry finds a settled key.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.keys.lease)
	defer cancel()

	tx, err := s.pool.Begin(ctx)
	if err != nil {
		s.internal(w, r, "claim idempotency key", err)
		return
	}
	defer tx.Rollback(ctx)
	c, err := s.keys.claimIn(ctx, tx, user, key, r.Method, r.URL.Path, hash)
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

	res, body, err := s.apply(ctx, tx, user, key, c.token, op)
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		b, _ := json.Marshal(apiErr)
		err = s.keys.fail(ctx, tx, user, key, c.token, apiErr.Status, b)
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			s.log.Error("mark idempotency key failed", "user", user, "err", err)
		}
		writeError(w, apiErr)
		return
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		// Rolled back with the claim: the key is as before this request.
		s.log.Error("write failed", "method", r.Method, "path", r.URL.Path, "user", user, "err", err)
		writeRaw(w, http.StatusInternalServerError, []byte(`{"error":"internal error; nothing was written, retry with the same key"}`))
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

// apply runs op under a savepoint of tx, so that a business refusal rolls
// back the operation but not the claim, and completes the key.
func (s *Server) apply(ctx context.Context, tx pgx.Tx, user, key, token string, op operation) (result, []byte, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return result{}, nil, err
	}
	defer sp.Rollback(ctx)
	res, err := op(ctx, sp)
	if err != nil {
		return result{}, nil, err
	}
	body, err := json.Marshal(res.body)
	if err != nil {
		return result{}, nil, err
	}
	if err := s.keys.succeed(ctx, sp, user, key, token, res.status, body, res.resource); err != nil {
		return result{}, nil, err
	}
	if err := sp.Commit(ctx); err != nil {
		return result{}, nil, err
	}
	return res, body, nil
}

func (s *Server) internal(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.log.Error(what, "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, &APIError{Status: http.StatusInternalServerError, Message: what + " failed; retry with the same key"})
}
