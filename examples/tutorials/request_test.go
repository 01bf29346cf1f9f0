package main

import "testing"

func TestRequestHash(t *testing.T) {
	t.Parallel()
	hash := func(method, path, body string) string {
		t.Helper()
		n, err := normalize([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return requestHash(method, path, n)
	}
	base := hash("POST", "/api/tutorials", `{"title":"a","tags":["x","y"],"n":1}`)

	t.Run("key order and whitespace do not matter", func(t *testing.T) {
		if got := hash("POST", "/api/tutorials", " {\n\"n\": 1, \"tags\": [\"x\", \"y\"], \"title\": \"a\"}"); got != base {
			t.Fatal("reordered payload hashes differently")
		}
	})
	t.Run("content, array order, number text, method and path all matter", func(t *testing.T) {
		for _, other := range []string{
			hash("POST", "/api/tutorials", `{"title":"b","tags":["x","y"],"n":1}`),
			hash("POST", "/api/tutorials", `{"title":"a","tags":["y","x"],"n":1}`),
			hash("POST", "/api/tutorials", `{"title":"a","tags":["x","y"],"n":1.0}`),
			hash("PUT", "/api/tutorials", `{"title":"a","tags":["x","y"],"n":1}`),
			hash("POST", "/api/other", `{"title":"a","tags":["x","y"],"n":1}`),
		} {
			if other == base {
				t.Fatal("a different request has the same hash")
			}
		}
	})
	t.Run("an empty body normalizes to null", func(t *testing.T) {
		n, err := normalize(nil)
		if err != nil || string(n) != "null" {
			t.Fatalf("got %q %v", n, err)
		}
	})
}
