package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
)

func TestStatusCommand(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	ctx := context.Background()
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := status(ctx, append(append([]string{}, e.dbArgs...), args...), &out)
		return out.String(), err
	}

	t.Run("an outbox no relay has read yet is lagging once its first event is old", func(t *testing.T) {
		e.append(t, "shop", "early", `{"n":1}`)
		time.Sleep(1100 * time.Millisecond)
		out, err := run("--max-age", "1s")
		if exitCode(err) != 2 || !strings.Contains(out, "no stream has stored progress") {
			t.Fatalf("exit %d (%v), output:\n%s", exitCode(err), err, out)
		}
	})

	stop := e.runRelay(t)
	e.append(t, "shop", "a", `{"n":1}`)
	e.append(t, "shop", "bad", `{"bad":true}`)
	schematest.Eventually(t, 20*time.Second, "the relay drained the outbox", func() bool { return e.backlog(t) == 0 })

	t.Run("a drained outbox exits 0 and shows stream, leader and dead letters", func(t *testing.T) {
		out, err := run()
		if err != nil {
			t.Fatalf("exit %d: %v\n%s", exitCode(err), err, out)
		}
		for _, want := range []string{"STREAM", "default", "0-1023", "pid ", "DEAD LETTERS", "shop", "mapper_parsing_exception", "retained events"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("--json carries the figures and the verdict", func(t *testing.T) {
		out, err := run("--json")
		if err != nil {
			t.Fatal(err)
		}
		var rep struct {
			OK      bool `json:"ok"`
			Streams []struct {
				Stream    string `json:"stream"`
				Backlog   int64  `json:"backlog"`
				LeaderPID int    `json:"leader_pid"`
			} `json:"streams"`
			DeadLetters []struct {
				Index  string `json:"index"`
				Parked int64  `json:"parked"`
			} `json:"dead_letters"`
			MaxAge float64 `json:"max_age_seconds"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		if !rep.OK || len(rep.Streams) != 1 || rep.Streams[0].Backlog != 0 || rep.Streams[0].LeaderPID == 0 ||
			len(rep.DeadLetters) != 1 || rep.DeadLetters[0].Parked != 1 || rep.MaxAge != 300 {
			t.Fatalf("report = %+v", rep)
		}
	})

	stop()
	t.Run("a backlog older than --max-age exits 2", func(t *testing.T) {
		e.append(t, "shop", "late", `{"n":2}`)
		time.Sleep(1100 * time.Millisecond)
		out, err := run("--max-age", "1s")
		if exitCode(err) != 2 || !strings.Contains(err.Error(), "over --max-age 1s") {
			t.Fatalf("exit %d (%v), output:\n%s", exitCode(err), err, out)
		}
		if !strings.Contains(out, "NONE") {
			t.Errorf("a stream without leader should say NONE:\n%s", out)
		}
		if _, err := run("--max-age", "1h"); err != nil {
			t.Fatalf("under the threshold: %v", err)
		}
		if _, err := run("--max-age", "0"); err != nil {
			t.Fatalf("threshold disabled: %v", err)
		}
	})
	t.Run("a bad flag value is refused", func(t *testing.T) {
		if _, err := run("--max-age", "-1s"); err == nil || !strings.Contains(err.Error(), "max-age") {
			t.Fatalf("err = %v", err)
		}
	})
}
