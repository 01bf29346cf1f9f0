package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
)

// Tutorial is a row as the API returns it.
type Tutorial struct {
	ID        string     `json:"id"`
	AuthorID  string     `json:"author_id"`
	RequestID string     `json:"request_id"`
	Title     string     `json:"title"`
	Body      string     `json:"body"`
	Tags      []string   `json:"tags"`
	Version   int64      `json:"version"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	DeletedAt *time.Time `json:"deleted_at,omitempty"`
}

// Document is what the search index holds for a tutorial.
type Document struct {
	ID        string    `json:"id"`
	AuthorID  string    `json:"author_id"`
	Title     string    `json:"title"`
	Body      string    `json:"body"`
	Tags      []string  `json:"tags"`
	Version   int64     `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Deleted is DELETE's answer.
type Deleted struct {
	ID      string `json:"id"`
	Deleted bool   `json:"deleted"`
	Version int64  `json:"version"`
}

const columns = `id::text, author_id, request_id, title, body, tags, version, created_at, updated_at, deleted_at`

func scanTutorial(row pgx.Row) (Tutorial, error) {
	var t Tutorial
	err := row.Scan(&t.ID, &t.AuthorID, &t.RequestID, &t.Title, &t.Body, &t.Tags, &t.Version, &t.CreatedAt, &t.UpdatedAt, &t.DeletedAt)
	return t, err
}

func (t Tutorial) document() Document {
	return Document{ID: t.ID, AuthorID: t.AuthorID, Title: t.Title, Body: t.Body, Tags: t.Tags,
		Version: t.Version, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
}

// appendUpsert writes the tutorial's outbox event at the row's version, in
// the caller's transaction.
func (s *Server) appendUpsert(ctx context.Context, tx pgx.Tx, t Tutorial, eventType string) error {
	doc, err := json.Marshal(t.document())
	if err != nil {
		return err
	}
	if _, err = s.outbox.Append(ctx, tx, outbox.Event{IndexName: s.index, SourceID: t.ID, Version: t.Version,
		Op: outbox.OpUpsert, Document: doc, EventType: eventType}); err != nil {
		return err
	}
	if s.notify == "" || eventType != "tutorial.created" {
		return nil
	}
	// The notification commits with the tutorial or not at all; its dedupe
	// key makes "one message per tutorial" hold across retries.
	payload, err := json.Marshal(map[string]string{"event": eventType, "id": t.ID, "title": t.Title, "author_id": t.AuthorID})
	if err != nil {
		return err
	}
	_, err = s.outbox.AppendMessage(ctx, tx, outbox.Message{Destination: s.notify, DedupeKey: "tutorial-created:" + t.ID, Payload: payload})
	return err
}

// writeHeaders checks what every write needs before any work: who is
// calling and which operation this is.
func writeHeaders(r *http.Request) (user, key string, e *APIError) {
	if user, e = userID(r); e != nil {
		return "", "", e
	}
	key = r.Header.Get(HeaderIdempotencyKey)
	if e = validateKey(key); e != nil {
		return "", "", e
	}
	return user, key, nil
}

// writeRequest is what every write handler reads before claiming its key.
type writeRequest struct {
	user, key, id string
	payload       []byte
}

// readWrite reads the headers, the path id (when withID) and the body of a
// write, answering the error itself; ok is false when it did.
func readWrite(w http.ResponseWriter, r *http.Request, withID bool) (req writeRequest, ok bool) {
	var e *APIError
	if req.user, req.key, e = writeHeaders(r); e == nil && withID {
		req.id, e = pathID(r)
	}
	if e == nil {
		req.payload, e = readBody(w, r)
	}
	if e != nil {
		writeError(w, e)
		return req, false
	}
	return req, true
}

// create is POST /api/tutorials. Invalid input is refused before the key
// is claimed, so a client can fix its payload and reuse the key.
func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	req, ok := readWrite(w, r, false)
	if !ok {
		return
	}
	user, key, payload := req.user, req.key, req.payload
	var in createInput
	if e := decodeStrict(payload, &in); e != nil {
		writeError(w, e)
		return
	}
	title, tags, e := validateContent(in.Title, in.Body, in.Tags)
	if e != nil {
		writeError(w, e)
		return
	}
	requestID := in.RequestID
	if requestID == "" {
		requestID = key
	} else if len(requestID) > MaxKeyBytes {
		writeError(w, badField("request_id", "is longer than %d bytes", MaxKeyBytes))
		return
	}
	s.idempotent(w, r, user, key, payload, func(ctx context.Context, tx pgx.Tx) (result, error) {
		t, err := scanTutorial(tx.QueryRow(ctx, `INSERT INTO `+s.table+` (author_id, request_id, title, body, tags)
			VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (author_id, request_id) DO NOTHING
			RETURNING `+columns, user, requestID, title, in.Body, tags))
		if errors.Is(err, pgx.ErrNoRows) {
			// The unique constraint caught a second submission of one
			// request_id under another key: answer with the first record.
			// ON CONFLICT waited for the other writer to commit, so the
			// row is visible to this next statement.
			s.metrics.uniqueConflicts.Inc()
			t, err = scanTutorial(tx.QueryRow(ctx, `SELECT `+columns+` FROM `+s.table+`
				WHERE author_id = $1 AND request_id = $2`, user, requestID))
			if err != nil {
				return result{}, fmt.Errorf("read existing tutorial: %w", err)
			}
			return result{status: http.StatusOK, body: t, resource: t.ID}, nil
		}
		if err != nil {
			return result{}, fmt.Errorf("insert tutorial: %w", err)
		}
		if err := s.appendUpsert(ctx, tx, t, "tutorial.created"); err != nil {
			return result{}, err
		}
		return result{status: http.StatusCreated, body: t, resource: t.ID}, nil
	})
}

// update is PUT /api/tutorials/{id}: a full replacement by the author. The
// UPDATE bumps the version it returns, so the event's version is the row's.
func (s *Server) update(w http.ResponseWriter, r *http.Request) {
	req, ok := readWrite(w, r, true)
	if !ok {
		return
	}
	user, key, id, payload := req.user, req.key, req.id, req.payload
	var in updateInput
	if e := decodeStrict(payload, &in); e != nil {
		writeError(w, e)
		return
	}
	title, tags, e := validateContent(in.Title, in.Body, in.Tags)
	if e != nil {
		writeError(w, e)
		return
	}
	s.idempotent(w, r, user, key, payload, func(ctx context.Context, tx pgx.Tx) (result, error) {
		t, err := scanTutorial(tx.QueryRow(ctx, `UPDATE `+s.table+`
			SET title = $3, body = $4, tags = $5, version = version + 1, updated_at = now()
			WHERE id = $1 AND author_id = $2 AND deleted_at IS NULL
			RETURNING `+columns, id, user, title, in.Body, tags))
		if errors.Is(err, pgx.ErrNoRows) {
			return result{}, s.whyNotWritable(ctx, tx, id)
		}
		if err != nil {
			return result{}, fmt.Errorf("update tutorial: %w", err)
		}
		if err := s.appendUpsert(ctx, tx, t, "tutorial.updated"); err != nil {
			return result{}, err
		}
		return result{status: http.StatusOK, body: t, resource: t.ID}, nil
	})
}

// remove is DELETE /api/tutorials/{id}: a soft delete that bumps the
// version, and a delete event at that version, so no older update that
// arrives late can bring the document back.
func (s *Server) remove(w http.ResponseWriter, r *http.Request) {
	req, ok := readWrite(w, r, true)
	if !ok {
		return
	}
	user, key, id, payload := req.user, req.key, req.id, req.payload
	s.idempotent(w, r, user, key, payload, func(ctx context.Context, tx pgx.Tx) (result, error) {
		var version int64
		err := tx.QueryRow(ctx, `UPDATE `+s.table+`
			SET deleted_at = now(), updated_at = now(), version = version + 1
			WHERE id = $1 AND author_id = $2 AND deleted_at IS NULL
			RETURNING version`, id, user).Scan(&version)
		if errors.Is(err, pgx.ErrNoRows) {
			return result{}, s.whyNotWritable(ctx, tx, id)
		}
		if err != nil {
			return result{}, fmt.Errorf("delete tutorial: %w", err)
		}
		if _, err := s.outbox.Append(ctx, tx, outbox.Event{IndexName: s.index, SourceID: id, Version: version,
			Op: outbox.OpDelete, EventType: "tutorial.deleted"}); err != nil {
			return result{}, err
		}
		return result{status: http.StatusOK, body: Deleted{ID: id, Deleted: true, Version: version}, resource: id}, nil
	})
}

// whyNotWritable explains an UPDATE that matched no row.
func (s *Server) whyNotWritable(ctx context.Context, tx pgx.Tx, id string) error {
	var deleted bool
	err := tx.QueryRow(ctx, `SELECT deleted_at IS NOT NULL FROM `+s.table+` WHERE id = $1`, id).Scan(&deleted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return &APIError{Status: http.StatusNotFound, Field: "id", Message: "no tutorial with this id"}
	case err != nil:
		return err
	case deleted:
		return &APIError{Status: http.StatusNotFound, Field: "id", Message: "this tutorial was deleted"}
	}
	return &APIError{Status: http.StatusForbidden, Field: HeaderUserID, Message: "only the tutorial's author may change it"}
}

// get is GET /api/tutorials/{id}, read from PostgreSQL.
func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	id, e := pathID(r)
	if e != nil {
		writeError(w, e)
		return
	}
	t, err := scanTutorial(s.pool.QueryRow(r.Context(), `SELECT `+columns+` FROM `+s.table+`
		WHERE id = $1 AND deleted_at IS NULL`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		writeError(w, &APIError{Status: http.StatusNotFound, Field: "id", Message: "no tutorial with this id"})
		return
	}
	if err != nil {
		s.log.Error("read tutorial", "id", id, "err", err)
		writeError(w, &APIError{Status: http.StatusInternalServerError, Message: "cannot read tutorial"})
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// pathID is the {id} path value in canonical (lowercase) form, so the
// outbox's source_id is the same whichever case the client used.
func pathID(r *http.Request) (string, *APIError) {
	id := r.PathValue("id")
	if !isUUID(id) {
		return "", badField("id", "%q is not a tutorial id (a UUID)", id)
	}
	return strings.ToLower(id), nil
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}
