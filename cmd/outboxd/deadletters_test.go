package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

func TestDeadLettersCommand(t *testing.T) {
	// Not parallel: t.Setenv sets $USER for the default operator.
	e := cliSetup(t)
	ctx := context.Background()
	e.runRelay(t)
	for i := range 3 {
		e.append(t, "shop", "bad-"+strconv.Itoa(i), `{"bad":true}`)
	}
	e.append(t, "blog", "bad-post", `{"bad":true}`)
	schematest.Eventually(t, 20*time.Second, "four events are parked", func() bool {
		dls, err := relay.ListDeadLetters(ctx, e.pool, e.schema, relay.DeadLetterFilter{Status: relay.DeadLetterParked})
		return err == nil && len(dls) == 4
	})
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := deadLetters(ctx, append(args[:1:1], append(append([]string{}, e.dbArgs...), args[1:]...)...), &out)
		return out.String(), err
	}
	listJSON := func(args ...string) []relay.DeadLetter {
		t.Helper()
		out, err := run(append([]string{"list", "--json"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var dls []relay.DeadLetter
		if err := json.Unmarshal([]byte(out), &dls); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		return dls
	}
	audit := func() (operator, action string, ids []int64) {
		t.Helper()
		err := e.pool.QueryRow(ctx, `SELECT operator, action, ids FROM "`+e.schema+`".audit_log ORDER BY id DESC LIMIT 1`).Scan(&operator, &action, &ids)
		if err != nil {
			t.Fatal(err)
		}
		return
	}

	t.Run("list shows parked dead letters with their reason, a page at a time", func(t *testing.T) {
		out, err := run("list", "--limit", "2")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "mapper_parsing_exception") || !strings.Contains(out, "more may follow: --after ") {
			t.Fatalf("output:\n%s", out)
		}
		first := listJSON("--limit", "2")
		rest := listJSON("--after", strconv.FormatInt(first[1].ID, 10))
		if len(first) != 2 || len(rest) != 2 {
			t.Fatalf("pages of %d and %d", len(first), len(rest))
		}
		if n := len(listJSON("--index", "blog")); n != 1 {
			t.Fatalf("--index blog: %d", n)
		}
	})
	t.Run("show prints one dead letter in full", func(t *testing.T) {
		d := listJSON("--index", "blog")[0]
		out, err := run("show", "--id", strconv.FormatInt(d.ID, 10))
		if err != nil || !strings.Contains(out, "bad-post") || !strings.Contains(out, `"bad": true`) {
			t.Fatalf("show: %v\n%s", err, out)
		}
	})
	t.Run("retry and discard need a selection", func(t *testing.T) {
		if _, err := run("retry", "--operator", "x"); err == nil || !strings.Contains(err.Error(), "--all") {
			t.Fatalf("err = %v", err)
		}
		if _, err := run("list", "--status", "lost"); err == nil || !strings.Contains(err.Error(), "status") {
			t.Fatalf("err = %v", err)
		}
		if _, err := run("list", "--id", "x1"); err == nil {
			t.Fatal("a bad --id was accepted")
		}
	})
	t.Run("retry by id re-queues through the outbox and is audited", func(t *testing.T) {
		shop := listJSON("--index", "shop")
		ids := strconv.FormatInt(shop[0].ID, 10) + "," + strconv.FormatInt(shop[1].ID, 10)
		out, err := run("retry", "--id", ids, "--operator", "alice")
		if err != nil || !strings.Contains(out, "re-queued 2 dead letter(s) as alice") {
			t.Fatalf("retry: %v\n%s", err, out)
		}
		op, action, got := audit()
		if op != "alice" || action != "deadletters.retry" || len(got) != 2 || got[0] != shop[0].ID {
			t.Fatalf("audit: %s %s %v", op, action, got)
		}
		// The sink still rejects them, so the running relay parks them again.
		schematest.Eventually(t, 20*time.Second, "the retried events come back as new dead letters", func() bool { return len(listJSON("--index", "shop")) == 3 })
		if n := len(listJSON("--status", "retried")); n != 2 {
			t.Fatalf("retried: %d", n)
		}
	})
	t.Run("discard by index defaults the operator to the OS user", func(t *testing.T) {
		t.Setenv("USER", "ops-bob")
		out, err := run("discard", "--index", "blog", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Count    int    `json:"count"`
			Operator string `json:"operator"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.Count != 1 || res.Operator != "ops-bob" {
			t.Fatalf("discard: %v %+v", err, res)
		}
		if op, action, _ := audit(); op != "ops-bob" || action != "deadletters.discard" {
			t.Fatalf("audit: %s %s", op, action)
		}
	})
	t.Run("--all resolves every parked dead letter", func(t *testing.T) {
		out, err := run("discard", "--all", "--operator", "carol")
		if err != nil || !strings.Contains(out, "discarded 3") {
			t.Fatalf("discard --all: %v\n%s", err, out)
		}
		if n := len(listJSON()); n != 0 {
			t.Fatalf("still parked: %d", n)
		}
		if n := len(listJSON("--status", "all")); n != 6 {
			t.Fatalf("all statuses: %d", n)
		}
	})
}
