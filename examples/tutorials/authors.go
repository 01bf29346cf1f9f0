package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Author is PUT /api/authors/{id}'s answer.
type Author struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// AuthorCards is GET /api/authors/{id}/tutorials's answer: the author's
// name in PostgreSQL and their tutorials' cards as the cards index shows
// them, newest first.
type AuthorCards struct {
	AuthorID string `json:"author_id"`
	Name     string `json:"name"`
	Total    int    `json:"total"`
	Cards    []Card `json:"tutorials"`
}

type authorInput struct {
	Name *string `json:"name"`
}

// putAuthor is PUT /api/authors/{id}: an author names themselves (or
// renames), idempotently like every write. Nothing is appended here: the
// authors watch refreshes the cards of all their tutorials.
func (s *Server) putAuthor(w http.ResponseWriter, r *http.Request) {
	req, ok := readWrite(w, r, false)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if id != req.user {
		writeError(w, &APIError{Status: http.StatusForbidden, Field: HeaderUserID, Message: "an author may only name themselves"})
		return
	}
	var in authorInput
	if e := decodeStrict(req.payload, &in); e != nil {
		writeError(w, e)
		return
	}
	name := ""
	if in.Name != nil {
		name = strings.TrimSpace(*in.Name)
	}
	switch {
	case name == "":
		writeError(w, badField("name", "is required"))
		return
	case utf8.RuneCountInString(name) > MaxTitleRunes:
		writeError(w, badField("name", "is %d characters long, at most %d allowed", utf8.RuneCountInString(name), MaxTitleRunes))
		return
	}
	s.idempotent(w, r, req.user, req.key, req.payload, func(ctx context.Context, tx pgx.Tx) (result, error) {
		var a Author
		err := tx.QueryRow(ctx, `INSERT INTO `+s.authors+` (id, name) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, updated_at = now()
			RETURNING id, name`, id, name).Scan(&a.ID, &a.Name)
		if err != nil {
			return result{}, fmt.Errorf("name author: %w", err)
		}
		return result{status: http.StatusOK, body: a}, nil
	})
}

// authorTutorials is GET /api/authors/{id}/tutorials, read from the cards
// index (up to 100, newest first).
func (s *Server) authorTutorials(w http.ResponseWriter, r *http.Request) {
	if s.es == nil || s.cards == "" {
		writeError(w, &APIError{Status: http.StatusServiceUnavailable, Message: "the cards index is not configured (tutorials api --cards-index and an Elasticsearch URL)"})
		return
	}
	id := r.PathValue("id")
	out := AuthorCards{AuthorID: id, Name: id, Cards: []Card{}}
	err := s.pool.QueryRow(r.Context(), `SELECT name FROM `+s.authors+` WHERE id = $1`, id).Scan(&out.Name)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		s.log.Error("read author", "id", id, "err", err)
		writeError(w, &APIError{Status: http.StatusInternalServerError, Message: "cannot read author"})
		return
	}
	body, _ := json.Marshal(map[string]any{
		"query":            map[string]any{"term": map[string]any{"author_id.keyword": id}},
		"size":             100,
		"track_total_hits": true,
		"sort":             []any{map[string]any{"updated_at": map[string]any{"order": "desc", "unmapped_type": "date"}}},
	})
	res, err := s.es.Search(s.es.Search.WithContext(r.Context()), s.es.Search.WithIndex(s.cards),
		s.es.Search.WithBody(bytes.NewReader(body)), s.es.Search.WithIgnoreUnavailable(true))
	if err != nil {
		writeError(w, &APIError{Status: http.StatusBadGateway, Message: "Elasticsearch is unavailable"})
		return
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(res.Body, 8<<20))
	switch {
	case res.StatusCode == http.StatusNotFound:
		// No card was written yet, so the relay has not created the index.
		writeJSON(w, http.StatusOK, out)
		return
	case res.IsError():
		writeError(w, &APIError{Status: http.StatusBadGateway, Message: fmt.Sprintf("Elasticsearch answered %d", res.StatusCode)})
		return
	}
	var parsed struct {
		Hits struct {
			Total struct {
				Value int `json:"value"`
			} `json:"total"`
			Hits []struct {
				Source Card `json:"_source"`
			} `json:"hits"`
		} `json:"hits"`
	}
	if err := json.Unmarshal(raw, &parsed); err != nil {
		writeError(w, &APIError{Status: http.StatusBadGateway, Message: "cannot parse Elasticsearch's answer"})
		return
	}
	out.Total = parsed.Hits.Total.Value
	for _, h := range parsed.Hits.Hits {
		out.Cards = append(out.Cards, h.Source)
	}
	writeJSON(w, http.StatusOK, out)
}
