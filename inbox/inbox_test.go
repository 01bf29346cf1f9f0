package inbox_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
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

func TestInboxVerify(t *testing.T) {
	t.Parallel()
	billing := inbox.Sender{Source: "billing", Secrets: [][]byte{[]byte("new-secret"), []byte("old-secret")}}
	shipping := inbox.Sender{Source: "shipping", Secrets: [][]byte{[]byte("shipping-secret")}}
	signed := func(secret, id, body string) http.Header {
		ts := time.Now().Unix()
		h := http.Header{}
		h.Set(webhook.HeaderID, id)
		h.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts, 10))
		h.Set(webhook.HeaderSignature, webhook.Sign([]byte(secret), id, ts, []byte(body)))
		return h
	}

	t.Run("the key is webhook-id and the source the sender whose secret verified", func(t *testing.T) {
		t.Parallel()
		h := signed("shipping-secret", "order-1", `{}`)
		h.Set(webhook.HeaderIdempotencyKey, "forged")
		m, err := inbox.Verify([]inbox.Sender{billing, shipping}, h, []byte(`{}`), time.Now())
		if err != nil || m.Source != "shipping" || m.Key != "order-1" {
			t.Fatalf("got %+v, %v", m, err)
		}
	})
	t.Run("any of a sender's secrets verifies (rotation)", func(t *testing.T) {
		t.Parallel()
		m, err := inbox.Verify([]inbox.Sender{billing}, signed("old-secret", "k", `{}`), []byte(`{}`), time.Now())
		if err != nil || m.Source != "billing" {
			t.Fatalf("got %+v, %v", m, err)
		}
	})
	t.Run("no sender's secret: refused", func(t *testing.T) {
		t.Parallel()
		if _, err := inbox.Verify([]inbox.Sender{billing, shipping}, signed("other", "k", `{}`), []byte(`{}`), time.Now()); !errors.Is(err, inbox.ErrNotSigned) {
			t.Fatalf("got %v", err)
		}
	})
}
