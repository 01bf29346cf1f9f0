package admin_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/webhook"
)

func TestAdminMessages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.reg.MustRegister(webhook.NewLedgerCollector(e.pool, `"`+e.schema+`"`))
	e.startAdmin(t, admin.Config{})
	_, err := e.pool.Exec(context.Background(), `INSERT INTO "`+e.schema+`".deliveries (destination, dedupe_key, event_id, payload, state, reserved_at)
		VALUES ('billing', 'a', 1, '{}', 'delivered', now()), ('billing', 'b', 2, '{}', 'delivered', now()),
		       ('billing', 'c', 3, '{}', 'unknown', now()), ('billing', 'd', 4, '{}', 'reserved', now() - interval '1 minute'),
		       ('mailer', 'e', 5, '{}', 'failed', now()), ('mailer', 'f', 6, '{}', 'skipped', now()),
		       ('mailer', 'g', 7, '{}', 'retrying', now() - interval '2 minutes')`)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the summary shows each destination's messages by ledger state", func(t *testing.T) {
		code, body, _ := e.get(t, "/api/summary")
		if code != 200 {
			t.Fatalf("/api/summary: %d %s", code, body)
		}
		var s admin.Summary
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatal(err)
		}
		if len(s.Messages) != 2 {
			t.Fatalf("messages = %+v", s.Messages)
		}
		b, m := s.Messages[0], s.Messages[1]
		if b.Destination != "billing" || b.Delivered != 2 || b.Unknown != 1 || b.Reserved != 1 || b.OldestReserved < 59 ||
			m.Destination != "mailer" || m.Failed != 1 || m.Skipped != 1 || m.Retrying != 1 || m.OldestReserved < 119 {
			t.Fatalf("messages = %+v", s.Messages)
		}
	})
	t.Run("the dashboard shows the messages table in a browser", func(t *testing.T) {
		dom := headless(t, chromium(t), e.base+"/", "--dump-dom")
		if !strings.Contains(dom, `data-loaded="1"`) {
			t.Fatal("the page did not load its summary")
		}
		row := regexp.MustCompile(`(?s)<tr data-destination="billing">.*?</tr>`).FindString(dom)
		if row == "" {
			t.Fatal("the messages table has no row for billing")
		}
		if got := shown(t, row, `data-metric="unknown"[^>]*>([^<]*)</td>`); got != 1 {
			t.Fatalf("billing shows %v unknown", got)
		}
		if got := shown(t, row, `data-metric="delivered"[^>]*>([^<]*)</td>`); got != 2 {
			t.Fatalf("billing shows %v delivered", got)
		}
		mailer := regexp.MustCompile(`(?s)<tr data-destination="mailer">.*?</tr>`).FindString(dom)
		if got := shown(t, mailer, `data-metric="retrying"[^>]*>([^<]*)</td>`); got != 1 {
			t.Fatalf("mailer shows %v retrying", got)
		}
	})
	t.Run("/metrics has the ledger gauges", func(t *testing.T) {
		m := e.scrape(t)
		if m.sum("outboxd_messages_total", "destination", "billing", "state", "delivered") != 2 || m.sum("outboxd_messages_unknown") != 1 {
			t.Fatalf("ledger gauges missing or wrong")
		}
	})
}
