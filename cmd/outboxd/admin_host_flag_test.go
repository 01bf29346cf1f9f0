package main

import (
	"flag"
	"io"
	"reflect"
	"testing"
)

func TestAdminHostFlag(t *testing.T) {
	// Not parallel: a subtest sets the environment.
	parse := func(t *testing.T, args ...string) []string {
		t.Helper()
		fs := flag.NewFlagSet("relay", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var hosts listFlag
		fs.Var(&hosts, "admin-host", "")
		if err := parseFlags(fs, args); err != nil {
			t.Fatal(err)
		}
		return hosts
	}
	t.Run("repeated and comma-separated values add up", func(t *testing.T) {
		got := parse(t, "--admin-host", "relay-1, relay-1.internal:9464", "--admin-host=dash.example")
		if want := []string{"relay-1", "relay-1.internal:9464", "dash.example"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("got %q, want %q", got, want)
		}
	})
	t.Run("OUTBOXD_ADMIN_HOST sets it when the command line does not", func(t *testing.T) {
		t.Setenv("OUTBOXD_ADMIN_HOST", "a.example,b.example")
		if got, want := parse(t), []string{"a.example", "b.example"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("got %q, want %q", got, want)
		}
		if got, want := parse(t, "--admin-host", "c.example"), []string{"c.example"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("the command line must win: got %q, want %q", got, want)
		}
	})
}
