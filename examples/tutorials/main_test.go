package main

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
)

func TestFlags(t *testing.T) {
	// Not parallel: it sets the environment.
	parse := func(t *testing.T, name string, args ...string) *flag.FlagSet {
		t.Helper()
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		addDBFlags(fs)
		fs.String("addr", "127.0.0.1:8080", "")
		fs.String("api", "http://127.0.0.1:8080", "")
		if err := parseFlags(fs, args); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	get := func(fs *flag.FlagSet, name string) string { return fs.Lookup(name).Value.String() }

	t.Run("the command line wins over OUTBOXD_<FLAG> and the alias", func(t *testing.T) {
		t.Setenv("OUTBOXD_DATABASE_URL", "postgres://env@h/db")
		t.Setenv("DATABASE_URL", "postgres://alias@h/db")
		if got := get(parse(t, "api", "--database-url", "postgres://arg@h/db"), "database-url"); got != "postgres://arg@h/db" {
			t.Fatalf("database-url = %q", got)
		}
	})
	t.Run("OUTBOXD_<FLAG> wins over the alias", func(t *testing.T) {
		t.Setenv("OUTBOXD_DATABASE_URL", "postgres://env@h/db")
		t.Setenv("DATABASE_URL", "postgres://alias@h/db")
		if got := get(parse(t, "api"), "database-url"); got != "postgres://env@h/db" {
			t.Fatalf("database-url = %q", got)
		}
	})
	t.Run("an alias of one command does not set another command's flag", func(t *testing.T) {
		t.Setenv("OUTBOXD_API_ADDR", "127.0.0.1:9999")
		if got := get(parse(t, "api"), "addr"); got != "127.0.0.1:9999" {
			t.Fatalf("api --addr = %q", got)
		}
		if got := get(parse(t, "demo"), "addr"); got != "127.0.0.1:8080" {
			t.Fatalf("demo --addr = %q", got)
		}
	})
	t.Run("a bad value in the environment is refused naming the variable", func(t *testing.T) {
		t.Setenv("OUTBOXD_KEY_TTL", "soon")
		fs := flag.NewFlagSet("api", flag.ContinueOnError)
		fs.Duration("key-ttl", 0, "")
		if err := parseFlags(fs, nil); err == nil || !strings.Contains(err.Error(), "OUTBOXD_KEY_TTL") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("the demo's output hides the password of a URL", func(t *testing.T) {
		var b bytes.Buffer
		if _, err := (redactWriter{&b}).Write([]byte("demo run against http://carol:sEcret-api@127.0.0.1:1 as user x\n")); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(b.String(), "sEcret") || !strings.Contains(b.String(), "http://carol:xxxxx@127.0.0.1:1") {
			t.Fatalf("output %q", b.String())
		}
	})
}
