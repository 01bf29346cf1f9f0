package tooltest

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// DocWriters change the three tables of a Docs at random, one change per
// transaction, the watches appending the refreshes: tutorials edited,
// deleted and created again, authors renamed, tags added, moved to
// another tutorial and deleted.
type DocWriters struct {
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	Changes atomic.Int64
}

// StartWriters starts n writers over the tutorials 1..tutorials; pause,
// when > 0, is the sleep between two changes of a writer.
func (d *Docs) StartWriters(t *testing.T, n, tutorials int, pause time.Duration) *DocWriters {
	t.Helper()
	ctx := context.Background()
	wr := &DocWriters{done: make(chan struct{})}
	t.Cleanup(wr.Halt) // before the schema is dropped
	authors := tutorials/DocsAuthorsPer + 1
	changes := []string{
		`UPDATE {s}.tutorials SET title = 'edited ' || (bump + 1), bump = bump + 1 WHERE id = $1::bigint`,
		`UPDATE {s}.authors SET name = 'renamed ' || $1::bigint || ' ' || md5(random()::text) WHERE id = 1 + $1::bigint % ` + itoa(authors),
		`INSERT INTO {s}.tags (tutorial_id, name) SELECT id, 'new ' || id FROM {s}.tutorials WHERE id = $1::bigint`,
		`UPDATE {s}.tags SET tutorial_id = $1::bigint WHERE id = (SELECT min(id) FROM {s}.tags WHERE tutorial_id = $1::bigint * 7 % ` + itoa(tutorials) + ` + 1)
			AND EXISTS (SELECT 1 FROM {s}.tutorials WHERE id = $1::bigint)`,
		`DELETE FROM {s}.tags WHERE id = (SELECT min(id) FROM {s}.tags WHERE tutorial_id = $1::bigint)`,
		`DELETE FROM {s}.tutorials WHERE id = $1::bigint`,
		`INSERT INTO {s}.tutorials (id, title, author_id) VALUES ($1::bigint, 'again ' || $1::bigint, 1 + $1::bigint % ` + itoa(authors) + `) ON CONFLICT (id) DO NOTHING`,
	}
	for i := range changes {
		changes[i] = d.SQL(changes[i])
	}
	for w := range n {
		wr.wg.Add(1)
		go func() {
			defer wr.wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 11))
			for {
				select {
				case <-wr.done:
					return
				default:
				}
				id := int64(1 + rnd.IntN(tutorials))
				_, err := d.Pool.Exec(ctx, changes[rnd.IntN(len(changes))], id)
				var pgErr *pgconn.PgError
				switch {
				case errors.As(err, &pgErr) && (pgErr.Code[:2] == "40" || pgErr.Code[:2] == "23"):
					// A deadlock, or a tag moved to a tutorial deleted
					// meanwhile: the change did not happen.
				case err != nil:
					t.Errorf("writer: %v", err)
					return
				default:
					wr.Changes.Add(1)
				}
				if pause > 0 {
					time.Sleep(pause)
				}
			}
		}()
	}
	return wr
}

// Halt ends the writers and waits for them; again is a no-op.
func (wr *DocWriters) Halt() {
	wr.once.Do(func() { close(wr.done) })
	wr.wg.Wait()
}

func itoa(n int) string { return strconv.Itoa(n) }
