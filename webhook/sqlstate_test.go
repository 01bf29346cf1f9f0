package webhook

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestTransientSQLState: the check errors that say nothing about the
// message (run the check again) and those that will recur for it (fail
// it), as the README lists them.
func TestTransientSQLState(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{
		"57P01": true,  // admin_shutdown: pg_terminate_backend, a restart
		"40P01": true,  // deadlock_detected
		"40001": true,  // serialization_failure
		"57014": true,  // query_canceled: check_timeout (statement_timeout)
		"53300": true,  // too_many_connections
		"08006": true,  // connection_failure
		"55P03": true,  // lock_not_available
		"58000": true,  // system_error
		"42P01": false, // undefined_table: the check is wrong for every message
		"22P02": false, // invalid_text_representation: this payload
		"25006": false, // read_only_sql_transaction: a check that writes
		"42601": false, // syntax_error
		"55000": false, // object_not_in_prerequisite_state: class 55 is not transient, only 55P03
		"":      false,
		"57":    false,
	} {
		if got := transientSQLState(code); got != want {
			t.Errorf("transientSQLState(%q) = %v, want %v", code, got, want)
		}
	}
}

// TestCheckRunsOf: the erred runs of a check that a parked row's
// last_error holds are read back as written; any other last_error (a
// request's answer, an operator's note) holds none.
func TestCheckRunsOf(t *testing.T) {
	t.Parallel()
	pgErr := &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}
	for _, runs := range []int{1, 7, 123} {
		if got := checkRunsOf(checkRetryReason(runs, 8, pgErr)); got != runs {
			t.Errorf("checkRunsOf(checkRetryReason(%d)) = %d", runs, got)
		}
	}
	for _, s := range []string{"", "HTTP 429: check run 3 of 8", "check: syntax error (SQLSTATE 42601)", "check run x of 8", "check run -2 of 8"} {
		if got := checkRunsOf(s); got != 0 {
			t.Errorf("checkRunsOf(%q) = %d, want 0", s, got)
		}
	}
}
