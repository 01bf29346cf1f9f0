package inbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

func TestInboxReceive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("the first delivery of a key is first, every repeat is not", func(t *testing.T) {
		t.Parallel()
		pool, name := schematest.Setup(t)
		for i, want := range []bool{true, false, false} {
			first, err := inbox.ReceiveIn(ctx, pool, name, "billing", "order-1")
			if err != nil || first != want {
				t.Fatalf("delivery %d: first=%t err=%v, want %t", i+1, first, err, want)
			}
		}
		if first, err := inbox.ReceiveIn(ctx, pool, name, "shipping", "order-1"); err != nil || !first {
			t.Fatalf("another source with the same key: first=%t err=%v", first, err)
		}
	})

	t.Run("a rolled back side effect rolls back the record, so the next delivery is first", func(t *testing.T) {
		t.Parallel()
		pool, name := schematest.Setup(t)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if first, err := inbox.ReceiveIn(ctx, tx, name, "billing", "k"); err != nil || !first {
			t.Fatalf("first=%t err=%v", first, err)
		}
		_ = tx.Rollback(ctx)
		if first, err := inbox.ReceiveIn(ctx, pool, name, "billing", "k"); err != nil || !first {
			t.Fatalf("after the rollback: first=%t err=%v", first, err)
		}
	})

	t.Run("concurrent deliveries of one key: exactly one side effect", func(t *testing.T) {
		t.Parallel()
		pool, name := schematest.Setup(t)
		if _, err := pool.Exec(ctx, `CREATE TABLE "`+name+`".effects (key text)`); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					first, err := inbox.ReceiveIn(ctx, tx, name, "billing", "k")
					if err != nil || !first {
						return err
					}
					_, err = tx.Exec(ctx, `INSERT INTO "`+name+`".effects VALUES ('k')`)
					return err
				})
				if err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+name+`".effects`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%d effects (%v)", n, err)
		}
	})

	t.Run("SQL callers get the same answer from inbox_receive", func(t *testing.T) {
		t.Parallel()
		pool, name := schematest.Setup(t)
		var a, b bool
		err := pool.QueryRow(ctx, `SELECT "`+name+`".inbox_receive('s', 'k'), "`+name+`".inbox_receive('s', 'k')`).Scan(&a, &b)
		if err != nil || !a || b {
			t.Fatalf("got %t, %t, %v", a, b, err)
		}
	})

	t.Run("an empty source or key is refused, naming it", func(t *testing.T) {
		t.Parallel()
		pool, name := schematest.Setup(t)
		if _, err := inbox.ReceiveIn(ctx, pool, name, "", "k"); err == nil || !strings.Contains(err.Error(), "source:") {
			t.Fatalf("got %v", err)
		}
		if _, err := inbox.ReceiveIn(ctx, pool, name, "s", ""); err == nil || !strings.Contains(err.Error(), "key:") {
			t.Fatalf("got %v", err)
		}
	})
}
