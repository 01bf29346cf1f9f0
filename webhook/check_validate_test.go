package webhook_test

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/webhook"
)

// TestValidateCheck: what outboxd check and relay refuse of a check
// before any message, besides what NewSink refuses: a first column that
// is not boolean, and a statement a READ ONLY transaction refuses.
func TestValidateCheck(t *testing.T) {
	t.Parallel()
	e := setup(t)
	q := `"` + e.schema + `"`
	if _, err := e.pool.Exec(t.Context(), `CREATE TABLE `+q+`.seen (k text)`); err != nil {
		t.Fatal(err)
	}
	for check, want := range map[string]string{
		`SELECT $1 <> '' AND $2::jsonb IS NOT NULL`:                                             "",
		`SELECT NOT EXISTS (SELECT FROM ` + q + `.seen WHERE k = $1) AND $2::jsonb IS NOT NULL`: "",
		`SELEC true`:                     "PostgreSQL cannot prepare it: syntax error",
		`SELECT $1::text <> ''`:          "both $1",
		`SELECT length($1) + length($2)`: "its first column is of type int4; it must be a boolean",
		`WITH w AS (INSERT INTO ` + q + `.seen VALUES ($1) RETURNING true) SELECT $2::jsonb IS NOT NULL FROM w`: "it writes (INSERT), and checks run READ ONLY",
		`SELECT true FROM ` + q + `.seen WHERE k = $1 AND $2::jsonb IS NOT NULL FOR UPDATE`:                     "it locks rows (FOR UPDATE or FOR SHARE)",
	} {
		d := destination("orders", "http://127.0.0.1:1", false)
		d.Check = check
		err := webhook.ValidateCheck(t.Context(), e.pool, d)
		switch {
		case want == "" && err != nil:
			t.Errorf("check %q: %v", check, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "destination orders: check: ")):
			t.Errorf("check %q: %v, want an error naming the destination and %q", check, err, want)
		}
	}
	var n int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+q+`.seen`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows written by validating the checks (%v)", n, err)
	}
}
