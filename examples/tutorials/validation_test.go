package main

import (
	"net/http"
	"strings"
	"testing"
)

func TestValidation(t *testing.T) {
	t.Parallel()
	env := setup(t)
	long := strings.Repeat("x", MaxBodyBytes+1)
	cases := []struct {
		name, method, path, user, key, body string
		status                              int
		field                               string
	}{
		{"a write without X-User-ID is 401", "POST", "/api/tutorials", "", "k", payload, 401, HeaderUserID},
		{"a POST without Idempotency-Key is 400 naming the header", "POST", "/api/tutorials", "u", "", payload, 400, HeaderIdempotencyKey},
		{"a PUT without Idempotency-Key is 400 too", "PUT", "/api/tutorials/00000000-0000-4000-8000-000000000000", "u", "", payload, 400, HeaderIdempotencyKey},
		{"a DELETE without Idempotency-Key is 400 too", "DELETE", "/api/tutorials/00000000-0000-4000-8000-000000000000", "u", "", "", 400, HeaderIdempotencyKey},
		{"a key with spaces is refused", "POST", "/api/tutorials", "u", "a b", payload, 400, HeaderIdempotencyKey},
		{"invalid JSON is 400", "POST", "/api/tutorials", "u", "k", `{"title": "x",}`, 400, ""},
		{"an empty body is 400", "POST", "/api/tutorials", "u", "k", "", 400, ""},
		{"trailing data after the object is 400", "POST", "/api/tutorials", "u", "k", `{"title":"x"} {}`, 400, ""},
		{"an unknown field is named", "POST", "/api/tutorials", "u", "k", `{"title":"x","author":"me"}`, 400, "author"},
		{"request_id is unknown on PUT", "PUT", "/api/tutorials/00000000-0000-4000-8000-000000000000", "u", "k", `{"title":"x","request_id":"r"}`, 400, "request_id"},
		{"a missing title is named", "POST", "/api/tutorials", "u", "k", `{"body":"text"}`, 400, "title"},
		{"an empty title is named", "POST", "/api/tutorials", "u", "k", `{"title":"   "}`, 400, "title"},
		{"a title over 200 characters is named", "POST", "/api/tutorials", "u", "k", `{"title":"` + strings.Repeat("é", 201) + `"}`, 400, "title"},
		{"a title of the wrong type is named", "POST", "/api/tutorials", "u", "k", `{"title":42}`, 400, "title"},
		{"an oversize body field is named", "POST", "/api/tutorials", "u", "k", `{"title":"x","body":"` + long + `"}`, 400, "body"},
		{"an oversize request is 413", "POST", "/api/tutorials", "u", "k", `{"title":"x","body":"` + strings.Repeat("y", MaxRequestBytes) + `"}`, 413, "body"},
		{"an empty tag is named", "POST", "/api/tutorials", "u", "k", `{"title":"x","tags":["a",""]}`, 400, "tags[1]"},
		{"a malformed id is named", "PUT", "/api/tutorials/42", "u", "k", payload, 400, "id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := env.do(t, c.method, c.path, c.user, c.key, c.body)
			if r.status != c.status {
				t.Fatalf("want %d, got %d %s", c.status, r.status, r.body)
			}
			e := r.apiError(t)
			if e.Field != c.field || e.Message == "" {
				t.Fatalf("want field %q and a message, got %s", c.field, r.body)
			}
		})
	}

	t.Run("refused input does not consume the key", func(t *testing.T) {
		if n := env.count(t, `SELECT count(*) FROM "`+env.tables+`".idempotency_keys`); n != 0 {
			t.Fatalf("want no keys stored, got %d", n)
		}
		// The client fixes its payload and retries with the same key.
		r := env.do(t, "POST", "/api/tutorials", "u", "k", `{"title":"fixed"}`)
		if r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("want a fresh 201, got %d %s", r.status, r.body)
		}
		if n := env.rows(t); n != 1 {
			t.Fatalf("want 1 tutorial, got %d", n)
		}
	})
}
