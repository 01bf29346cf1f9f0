package webhook

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// validateCheck prepares the destination's check once, so that a relay
// refuses to start with one PostgreSQL cannot run rather than pausing the
// destination at its first message.
func validateCheck(ctx context.Context, pool *pgxpool.Pool, d Destination) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("destination %s: check: cannot reach PostgreSQL to prepare it: %w", d.Name, err)
	}
	defer conn.Release()
	sd, err := conn.Conn().PgConn().Prepare(ctx, "", d.Check, nil)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return fmt.Errorf("destination %s: check: PostgreSQL cannot prepare it: %s (SQLSTATE %s)", d.Name, pgErr.Message, pgErr.Code)
		}
		return fmt.Errorf("destination %s: check: %w", d.Name, err)
	}
	if len(sd.ParamOIDs) != 2 {
		return fmt.Errorf("destination %s: check: uses %d parameters; it must use both $1 (the dedupe key) and $2 (the payload)", d.Name, len(sd.ParamOIDs))
	}
	if len(sd.Fields) == 0 {
		return fmt.Errorf("destination %s: check: returns no column; its first column must be a boolean", d.Name)
	}
	return nil
}

// checkSlots bounds the connections the checks of every destination on
// one pool may hold at once, well below the pool's size, so slow checks
// never starve the relay's streams of connections.
var checkSlots sync.Map // *pgxpool.Pool -> chan struct{}

func slotsFor(pool *pgxpool.Pool) chan struct{} {
	n := max(1, int(pool.Config().MaxConns)/4)
	v, _ := checkSlots.LoadOrStore(pool, make(chan struct{}, n))
	return v.(chan struct{})
}

// eligible runs the destination's check for one message in a READ ONLY
// transaction with the destination's statement timeout.
func (s *Sink) eligible(ctx context.Context, key string, payload []byte) (bool, error) {
	select {
	case s.checkSlots <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	defer func() { <-s.checkSlots }()
	var ok *bool
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", s.dest.CheckTimeout.Milliseconds())); err != nil {
			return err
		}
		return tx.QueryRow(ctx, s.dest.Check, key, string(payload)).Scan(&ok)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return ok != nil && *ok, nil
}

// transientSQLState reports whether an error with this SQLSTATE says
// nothing about the message: the same check may well pass a moment later.
// Connection exceptions (08), serialization failures and deadlocks (40),
// insufficient resources such as too many connections (53), operator
// intervention such as an admin shutdown or a statement timeout (57),
// system errors (58) and a lock not available (55P03). Everything else
// (a data exception from this payload, a read-only violation, a syntax
// error) will recur for this message.
func transientSQLState(code string) bool {
	switch {
	case code == "55P03":
		return true
	case len(code) == 5:
		return strings.Contains(" 08 40 53 57 58 ", " "+code[:2]+" ")
	}
	return false
}

// checkRetryWait is how long a transient check error waits before the
// check runs again.
func checkRetryWait(d Destination, tries int) time.Duration {
	return backoff(d.BackoffBase, d.BackoffMax, tries)
}
