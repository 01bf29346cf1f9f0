package webhook

import "testing"

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
