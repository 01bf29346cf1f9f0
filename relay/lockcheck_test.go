package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/schema/schematest"
)

// TestLockCheckQuery runs the check's statement against a real lock: it
// vouches only for the session that holds the key, on the server it was
// taken on.
func TestLockCheckQuery(t *testing.T) {
	ctx := context.Background()
	pool, name := schematest.Setup(t)
	key := streamKey(name, "default")
	holder, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		t.Fatal(err)
	}
	defer holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key) //nolint:errcheck
	mine, err := newLockCheck(ctx, holder.Conn(), key, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	// like copies mine's identity into a fresh check.
	like := func() *lockCheck {
		return &lockCheck{key: mine.key, pid: mine.pid, started: mine.started, every: mine.every, lost: make(chan struct{})}
	}
	// answer sends the check from another session, as a read does.
	answer := func(c *lockCheck) (held, lost bool) {
		t.Helper()
		c.mu.Lock()
		c.at, c.stored = time.Time{}, time.Time{}
		c.mu.Unlock()
		b := &pgx.Batch{}
		read := c.queueIfDue(b)
		br := other.SendBatch(ctx, b)
		if err := read(br); err != nil {
			t.Fatal(err)
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
		return c.vouches(time.Now(), time.Minute), c.isLost()
	}

	t.Run("the holding session's check says held", func(t *testing.T) {
		if held, lost := answer(mine); !held || lost {
			t.Fatalf("held %v, lost %v", held, lost)
		}
	})
	t.Run("another backend's pid is not the holder", func(t *testing.T) {
		c := like()
		c.pid++
		if _, lost := answer(c); !lost {
			t.Fatal("a check for another pid vouched for the lock")
		}
	})
	t.Run("the same pid on a server started at another time is not the holder", func(t *testing.T) {
		c := like()
		c.started = c.started.Add(-time.Microsecond)
		if _, lost := answer(c); !lost {
			t.Fatal("a check for another server vouched for the lock")
		}
	})
	t.Run("a lock nobody holds is not held", func(t *testing.T) {
		c := like()
		c.key++
		if _, lost := answer(c); !lost {
			t.Fatal("a check for a free lock vouched for it")
		}
	})
}
