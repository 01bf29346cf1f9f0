package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"unicode/utf8"
)

// Input limits. A request body is read up to MaxRequestBytes; the body
// field alone may hold MaxBodyBytes.
const (
	MaxTitleRunes   = 200
	MaxBodyBytes    = 64 << 10
	MaxRequestBytes = MaxBodyBytes + 16<<10
	MaxTags         = 20
	MaxTagRunes     = 50
	MaxKeyBytes     = 255
	MaxUserIDBytes  = 255
)

// Header names the API reads and writes.
const (
	HeaderUserID         = "X-User-ID"
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
)

// APIError is an error response: the HTTP status, what is wrong and, for
// bad input, the field (or header) at fault.
type APIError struct {
	Status  int    `json:"-"`
	Message string `json:"error"`
	Field   string `json:"field,omitempty"`
}

func (e *APIError) Error() string {
	if e.Field != "" {
		return e.Field + ": " + e.Message
	}
	return e.Message
}

func badField(field, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusBadRequest, Field: field, Message: fmt.Sprintf(format, args...)}
}

// createInput is POST /api/tutorials's body.
type createInput struct {
	Title     *string  `json:"title"`
	Body      string   `json:"body"`
	Tags      []string `json:"tags"`
	RequestID string   `json:"request_id"`
}

// updateInput is PUT /api/tutorials/{id}'s body: a full replacement.
type updateInput struct {
	Title *string  `json:"title"`
	Body  string   `json:"body"`
	Tags  []string `json:"tags"`
}

// readBody reads at most MaxRequestBytes; more is a 413.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *APIError) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &APIError{Status: http.StatusRequestEntityTooLarge, Field: "body",
				Message: fmt.Sprintf("request body is larger than %d bytes (the body field may hold at most %d bytes)", MaxRequestBytes, MaxBodyBytes)}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, &APIError{Status: http.StatusRequestTimeout, Field: "body", Message: "request body not received within the server's read timeout"}
		}
		return nil, &APIError{Status: http.StatusBadRequest, Message: "cannot read request body: " + err.Error()}
	}
	return b, nil
}

// decodeStrict decodes one JSON object into v, refusing unknown fields and
// trailing data, and turns decoder errors into field-naming API errors.
func decodeStrict(payload []byte, v any) *APIError {
	if len(bytes.TrimSpace(payload)) == 0 {
		return &APIError{Status: http.StatusBadRequest, Message: "request body is empty; send a JSON object"}
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, err := dec.Token(); err != io.EOF {
			return &APIError{Status: http.StatusBadRequest, Message: "invalid JSON: unexpected data after the object"}
		}
		return nil
	}
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return &APIError{Status: http.StatusBadRequest, Message: fmt.Sprintf("invalid JSON at byte %d: %v", syntax.Offset, err)}
	case errors.As(err, &typ):
		if typ.Field == "" {
			return &APIError{Status: http.StatusBadRequest, Message: fmt.Sprintf("invalid JSON: expected an object, got %s", typ.Value)}
		}
		return badField(typ.Field, "must be %s, got %s", jsonKind(typ.Type.String()), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &APIError{Status: http.StatusBadRequest, Message: "invalid JSON: unexpected end of input"}
	}
	// DisallowUnknownFields reports `json: unknown field "x"`, with no typed error.
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name := strings.Trim(f, `"`)
		return badField(name, "unknown field")
	}
	return &APIError{Status: http.StatusBadRequest, Message: "invalid JSON: " + err.Error()}
}

func jsonKind(goType string) string {
	switch {
	case goType == "string" || goType == "*string":
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "an array of strings"
	}
	return goType
}

func validateContent(title *string, body string, tags []string) (string, []string, *APIError) {
	if title == nil {
		return "", nil, badField("title", "is required")
	}
	t := strings.TrimSpace(*title)
	switch {
	case t == "":
		return "", nil, badField("title", "must not be empty")
	case utf8.RuneCountInString(t) > MaxTitleRunes:
		return "", nil, badField("title", "is %d characters long, at most %d allowed", utf8.RuneCountInString(t), MaxTitleRunes)
	case len(body) > MaxBodyBytes:
		return "", nil, badField("body", "is %d bytes long, at most %d allowed", len(body), MaxBodyBytes)
	case len(tags) > MaxTags:
		return "", nil, badField("tags", "has %d tags, at most %d allowed", len(tags), MaxTags)
	}
	out := make([]string, 0, len(tags))
	for i, tag := range tags {
		tag = strings.TrimSpace(tag)
		switch {
		case tag == "":
			return "", nil, badField(fmt.Sprintf("tags[%d]", i), "must not be empty")
		case utf8.RuneCountInString(tag) > MaxTagRunes:
			return "", nil, badField(fmt.Sprintf("tags[%d]", i), "is longer than %d characters", MaxTagRunes)
		}
		out = append(out, tag)
	}
	return t, out, nil
}

// validateKey checks the Idempotency-Key header: printable ASCII, so it
// can be logged and compared byte for byte.
func validateKey(key string) *APIError {
	switch {
	case key == "":
		return badField(HeaderIdempotencyKey, "header is required on every write (POST, PUT, DELETE); send a fresh UUID per operation and reuse it on retries")
	case len(key) > MaxKeyBytes:
		return badField(HeaderIdempotencyKey, "header is %d bytes long, at most %d allowed", len(key), MaxKeyBytes)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return badField(HeaderIdempotencyKey, "header must be printable ASCII without spaces")
		}
	}
	return nil
}
