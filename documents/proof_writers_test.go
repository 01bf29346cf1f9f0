package documents_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The proof's tables: parents, their children (a list in the parent's
// document) and a lookup row shared by many parents (its label in each of
// their documents). A parent's lookup is fixed by its id (id % proofLookups
// + 1), so that every component of a document's counters only grows:
// parents.bump grows with every change to the parent or its children
// (the old and the new parent of a moved child both), lookup.bump with
// every change to the lookup row, and a parent created again gets the
// bump it was deleted with plus one (graves keeps it meanwhile).
const (
	proofParents  = 2000
	proofLookups  = 20
	proofChildren = 3 // per parent at the start
)

func proofTables(e *env) string {
	return e.sql(fmt.Sprintf(`CREATE TABLE {s}.lookup (id int PRIMARY KEY, label text NOT NULL, bump bigint NOT NULL DEFAULT 0);
		CREATE TABLE {s}.parents (id bigint PRIMARY KEY, title text NOT NULL, lookup_id int NOT NULL REFERENCES {s}.lookup, bump bigint NOT NULL DEFAULT 0);
		CREATE TABLE {s}.children (id bigserial PRIMARY KEY, parent_id bigint NOT NULL REFERENCES {s}.parents ON DELETE CASCADE, name text NOT NULL);
		CREATE TABLE {s}.graves (id bigint PRIMARY KEY, bump bigint NOT NULL);
		CREATE INDEX ON {s}.children (parent_id);
		CREATE INDEX ON {s}.parents (lookup_id);
		INSERT INTO {s}.lookup (id, label) SELECT i, 'label ' || i FROM generate_series(1, %[1]d) i;
		INSERT INTO {s}.parents (id, title, lookup_id) SELECT i, 'parent ' || i, i %% %[1]d + 1 FROM generate_series(1, %[2]d) i;
		INSERT INTO {s}.children (parent_id, name) SELECT i, 'child ' || i || '.' || k FROM generate_series(1, %[2]d) i, generate_series(1, %[3]d) k`,
		proofLookups, proofParents, proofChildren))
}

// proofDefinition is the parent's document, $1 cast to the key's type so
// that a read of a page's ids goes through the primary key.
func proofDefinition(e *env) string {
	return e.sql(`SELECT p.id::text, jsonb_build_object('title', p.title, 'bump', p.bump, 'lookup', l.label, 'lookup_bump', l.bump,
		'children', (SELECT coalesce(jsonb_agg(jsonb_build_object('id', c.id, 'name', c.name) ORDER BY c.id), '[]') FROM {s}.children c WHERE c.parent_id = p.id))
		FROM {s}.parents p JOIN {s}.lookup l ON l.id = p.lookup_id WHERE p.id = ANY($1::text[]::bigint[])`)
}

// proofWriters change the tables at random, as an application would:
// one change and its counters' bumps per transaction, the watches
// appending the refreshes.
type proofWriters struct {
	done          chan struct{}
	once          sync.Once
	wg            sync.WaitGroup
	commits, skip atomic.Int64
	byKind        [8]atomic.Int64
}

var proofKinds = [8]string{"parent edited", "child added", "child edited", "child deleted", "child moved", "parent deleted", "parent created again", "lookup changed"}

func startProofWriters(t *testing.T, e *env, n int) *proofWriters {
	t.Helper()
	ctx := context.Background()
	wr := &proofWriters{done: make(chan struct{})}
	t.Cleanup(wr.halt) // before the schema is dropped
	for w := range n {
		wr.wg.Add(1)
		go func() {
			defer wr.wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 24))
			for {
				select {
				case <-wr.done:
					return
				default:
				}
				kind := rnd.IntN(len(proofKinds))
				a, b := int64(1+rnd.IntN(proofParents)), int64(1+rnd.IntN(proofParents))
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return proofChange(ctx, e, tx, kind, a, b, rnd) })
				var pgErr *pgconn.PgError
				switch {
				case errors.Is(err, errSkip):
					wr.skip.Add(1)
				case errors.As(err, &pgErr) && (pgErr.Code[:2] == "40" || pgErr.Code == "23503" || pgErr.Code == "23505"):
					// A deadlock, or a parent deleted or created by another
					// writer meanwhile: the change did not happen.
					wr.skip.Add(1)
				case err != nil:
					t.Errorf("writer: %s: %v", proofKinds[kind], err)
					return
				default:
					wr.commits.Add(1)
					wr.byKind[kind].Add(1)
				}
			}
		}()
	}
	return wr
}

// errSkip is a change that found nothing to change.
var errSkip = errors.New("nothing to change")

func proofChange(ctx context.Context, e *env, tx pgx.Tx, kind int, a, b int64, rnd *rand.Rand) error {
	bump := func(ids ...int64) error {
		slices.Sort(ids) // one order of row locks for every writer
		tag, err := tx.Exec(ctx, e.sql(`UPDATE {s}.parents SET bump = bump + 1 WHERE id = ANY($1::bigint[])`), slices.Compact(ids))
		if err == nil && tag.RowsAffected() == 0 {
			return errSkip
		}
		return err
	}
	exec := func(q string, args ...any) error {
		tag, err := tx.Exec(ctx, e.sql(q), args...)
		if err == nil && tag.RowsAffected() == 0 {
			return errSkip
		}
		return err
	}
	switch proofKinds[kind] {
	case "parent edited":
		return exec(`UPDATE {s}.parents SET title = 'edited ' || md5(random()::text), bump = bump + 1 WHERE id = $1`, a)
	case "child added":
		if err := bump(a); err != nil {
			return err
		}
		return exec(`INSERT INTO {s}.children (parent_id, name) VALUES ($1, 'added ' || md5(random()::text))`, a)
	case "child edited":
		if err := bump(a); err != nil {
			return err
		}
		return exec(`UPDATE {s}.children SET name = 'edited ' || md5(random()::text) WHERE id = (SELECT min(id) FROM {s}.children WHERE parent_id = $1)`, a)
	case "child deleted":
		if err := bump(a); err != nil {
			return err
		}
		return exec(`DELETE FROM {s}.children WHERE id = (SELECT max(id) FROM {s}.children WHERE parent_id = $1)`, a)
	case "child moved":
		if a == b {
			return errSkip
		}
		if err := bump(a, b); err != nil {
			return err
		}
		return exec(`UPDATE {s}.children SET parent_id = $2 WHERE id = (SELECT min(id) FROM {s}.children WHERE parent_id = $1)`, a, b)
	case "parent deleted":
		var last int64
		if err := tx.QueryRow(ctx, e.sql(`DELETE FROM {s}.parents WHERE id = $1 RETURNING bump`), a).Scan(&last); errors.Is(err, pgx.ErrNoRows) {
			return errSkip
		} else if err != nil {
			return err
		}
		return exec(`INSERT INTO {s}.graves VALUES ($1, $2)`, a, last)
	case "parent created again":
		var id, last int64
		err := tx.QueryRow(ctx, e.sql(`DELETE FROM {s}.graves WHERE id = (SELECT id FROM {s}.graves ORDER BY id LIMIT 1 OFFSET $1 FOR UPDATE SKIP LOCKED) RETURNING id, bump`), rnd.IntN(4)).Scan(&id, &last)
		if errors.Is(err, pgx.ErrNoRows) {
			return errSkip
		} else if err != nil {
			return err
		}
		return exec(fmt.Sprintf(`INSERT INTO {s}.parents (id, title, lookup_id, bump) VALUES ($1::bigint, 'again ' || $1::bigint, $1::bigint %% %d + 1, $2::bigint + 1)`, proofLookups), id, last)
	default: // lookup changed: about proofParents/proofLookups documents at once
		return exec(`UPDATE {s}.lookup SET label = 'label ' || md5(random()::text), bump = bump + 1 WHERE id = $1`, a%proofLookups+1)
	}
}

func (wr *proofWriters) halt() {
	wr.once.Do(func() { close(wr.done) })
	wr.wg.Wait()
}
