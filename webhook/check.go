package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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
	_, err = prepareCheck(ctx, conn.Conn().PgConn(), d)
	return err
}

// prepareCheck prepares the check unnamed and checks its parameters and
// columns.
func prepareCheck(ctx context.Context, conn *pgconn.PgConn, d Destination) (*pgconn.StatementDescription, error) {
	sd, err := conn.Prepare(ctx, "", d.Check, nil)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return nil, fmt.Errorf("destination %s: check: PostgreSQL cannot prepare it: %s (SQLSTATE %s)", d.Name, pgErr.Message, pgErr.Code)
		}
		return nil, fmt.Errorf("destination %s: check: %w", d.Name, err)
	}
	if len(sd.ParamOIDs) != 2 {
		return nil, fmt.Errorf("destination %s: check: uses %d parameters; it must use both $1 (the dedupe key) and $2 (the payload)", d.Name, len(sd.ParamOIDs))
	}
	if len(sd.Fields) == 0 {
		return nil, fmt.Errorf("destination %s: check: returns no column; its first column must be a boolean", d.Name)
	}
	return sd, nil
}

// ValidateCheck reports why d.Check cannot work as an eligibility check,
// or nil, without running it: what NewSink refuses (PostgreSQL cannot
// prepare it, it does not use both $1 and $2, it returns no column), with
// the check prepared as it runs, in a READ ONLY transaction, and besides a
// first column that is not boolean and a statement that writes or locks
// rows (from its plan: EXPLAIN, with both parameters NULL), which would
// fail every message. outboxd check and outboxd relay run it at start;
// NewSink keeps to the first three, so a check it accepts fails its
// messages at run time rather than the sink.
func ValidateCheck(ctx context.Context, pool *pgxpool.Pool, d Destination) error {
	if d.Check == "" {
		return nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("destination %s: check: cannot reach PostgreSQL to prepare it: %w", d.Name, err)
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("destination %s: check: cannot begin a READ ONLY transaction to prepare it: %w", d.Name, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	sd, err := prepareCheck(ctx, conn.Conn().PgConn(), d)
	if err != nil {
		return err
	}
	if oid := sd.Fields[0].DataTypeOID; oid != pgtype.BoolOID {
		name := fmt.Sprintf("OID %d", oid)
		if t, ok := conn.Conn().TypeMap().TypeForOID(oid); ok {
			name = t.Name
		}
		return fmt.Errorf("destination %s: check: its first column is of type %s; it must be a boolean (true sends the message)", d.Name, name)
	}
	var plan []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+d.Check, pgx.QueryExecModeExec, nil, nil).Scan(&plan); err != nil {
		return nil // prepared is what the relay has always required; the plan is a bonus
	}
	if node := writingNode(plan); node != "" {
		return fmt.Errorf("destination %s: check: it %s, and checks run READ ONLY: every message would fail", d.Name, node)
	}
	return nil
}

// writingNode names what in an EXPLAIN (FORMAT JSON) plan a READ ONLY
// transaction refuses: a ModifyTable node (INSERT, UPDATE, DELETE, MERGE,
// in a CTE too) or LockRows (FOR UPDATE, FOR SHARE).
func writingNode(plan []byte) string {
	var root []struct {
		Plan planNode `json:"Plan"`
	}
	if json.Unmarshal(plan, &root) != nil {
		return ""
	}
	var walk func(n planNode) string
	walk = func(n planNode) string {
		switch n.Type {
		case "ModifyTable":
			return "writes (" + strings.ToUpper(n.Operation) + ")"
		case "LockRows":
			return "locks rows (FOR UPDATE or FOR SHARE)"
		}
		for _, c := range n.Plans {
			if w := walk(c); w != "" {
				return w
			}
		}
		return ""
	}
	for _, r := range root {
		if w := walk(r.Plan); w != "" {
			return w
		}
	}
	return ""
}

type planNode struct {
	Type      string     `json:"Node Type"`
	Operation string     `json:"Operation"`
	Plans     []planNode `json:"Plans"`
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

// checkRetryReason is the last_error of a message parked by a transient
// check error, for an operator to read: the count itself is the row's
// check_runs, never parsed back from this text.
func checkRetryReason(runs, limit int, pgErr *pgconn.PgError) string {
	return fmt.Sprintf("check run %d of %d: %s (SQLSTATE %s); it runs again when due", runs, limit, pgErr.Message, pgErr.Code)
}
