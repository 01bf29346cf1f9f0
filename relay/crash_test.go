package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

// The crash test runs the relay as a real child process (this test binary
// re-executed) so that SIGKILL lands on a real process mid-flight.
const childEnv = "OUTBOXD_RELAY_CHILD_SCHEMA"

func TestMain(m *testing.M) {
	if name := os.Getenv(childEnv); name != "" {
		os.Exit(runChild(name))
	}
	os.Exit(m.Run())
}

// tableSink records every delivered event id in a table, committed before
// Write returns, so the test can compare deliveries to progress.
type tableSink struct {
	pool   *pgxpool.Pool
	schema string
}

func (s *tableSink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	ids := make([]int64, len(events))
	for i, e := range events {
		ids[i] = e.ID
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO "`+s.schema+`".delivered (id) SELECT unnest($1::bigint[])`, ids); err != nil {
		return nil, err
	}
	outs := make([]outbox.Outcome, len(events))
	for i := range outs {
		outs[i] = outbox.Outcome{Status: outbox.Applied}
	}
	return outs, nil
}

func runChild(name string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	r, err := relay.New(relay.Config{
		Pool: pool, Schema: name, Sink: &tableSink{pool: pool, schema: name},
		MaxBatchDocs: 50, MaxPollInterval: 10 * time.Millisecond, LeaseInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func TestRelayCrash(t *testing.T) {
	t.Parallel()
	pool, name := schematest.Setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE "`+name+`".delivered (id bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ob, _ := outbox.NewOutbox(name)

	// Producers commit out of id order: each transaction appends a few
	// events and holds them a random while before committing.
	prodCtx, stopProducers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; prodCtx.Err() == nil; i++ {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				for j := range 1 + rand.IntN(5) {
					_, err := ob.Append(ctx, tx, outbox.Event{IndexName: "items", SourceID: fmt.Sprintf("w%d-%d-%d", w, i, j), Version: 1, Op: outbox.OpUpsert, Document: json.RawMessage(`{}`)})
					if err != nil {
						t.Error(err)
						tx.Rollback(ctx)
						return
					}
				}
				time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
				if rand.IntN(10) == 0 {
					tx.Rollback(ctx)
				} else if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}

	child := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+name)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	checkNotAhead := func(when string) {
		t.Helper()
		var ahead int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+name+`".events e, "`+name+`".progress p
			WHERE (pg_visible_in_snapshot(e.xid, p.done_snapshot)
			       OR (p.batch_snapshot IS NOT NULL AND pg_visible_in_snapshot(e.xid, p.batch_snapshot) AND (e.xid, e.id) <= (p.cursor_xid, p.cursor_id)))
			  AND NOT EXISTS (SELECT 1 FROM "`+name+`".delivered d WHERE d.id = e.id)`).Scan(&ahead)
		if err != nil {
			t.Fatal(err)
		}
		if ahead != 0 {
			t.Fatalf("%s: progress acknowledges %d events that were never delivered", when, ahead)
		}
	}

	const kills = 6
	for k := range kills {
		cmd := child()
		time.Sleep(time.Duration(150+rand.IntN(500)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		checkNotAhead(fmt.Sprintf("after SIGKILL %d", k+1))
	}
	stopProducers()
	wg.Wait()

	cmd := child()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var missing int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+name+`".events e
			WHERE NOT EXISTS (SELECT 1 FROM "`+name+`".delivered d WHERE d.id = e.id)`).Scan(&missing)
		if err != nil {
			t.Fatal(err)
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d committed events never delivered after %d kills", missing, kills)
		}
		time.Sleep(50 * time.Millisecond)
	}
	checkNotAhead("after the final drain")
	var events, deliveries int
	_ = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM "`+name+`".events), (SELECT count(*) FROM "`+name+`".delivered)`).Scan(&events, &deliveries)
	t.Logf("%d events committed, %d deliveries (%d re-deliveries after %d kills)", events, deliveries, deliveries-events, kills)
}
