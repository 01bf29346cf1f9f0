package relay_test

import (
	"fmt"
	"testing"
)

func BenchmarkScratchVariant(b *testing.B) {
	for _, v := range []struct{ name, sql string }{
		{"baseline", ``},
		{"no-xid-index", `DROP INDEX %s.events_xid_id`},
		{"no-bucket", `ALTER TABLE %s.events DROP COLUMN bucket`},
		{"no-checks", `ALTER TABLE %[1]s.events DROP CONSTRAINT "source_id: must be 1 to 512 bytes", DROP CONSTRAINT "version: must be >= 1", DROP CONSTRAINT "op: must be upsert or delete", DROP CONSTRAINT "document: upsert needs a JSON object", DROP CONSTRAINT "document: delete must not carry one", DROP CONSTRAINT "headers: must be a JSON object", DROP CONSTRAINT "index_name: not a valid Elasticsearch index name"`},
		{"no-index-bucket-checks", `DROP INDEX %[1]s.events_xid_id; ALTER TABLE %[1]s.events DROP COLUMN bucket, DROP CONSTRAINT "source_id: must be 1 to 512 bytes", DROP CONSTRAINT "version: must be >= 1", DROP CONSTRAINT "op: must be upsert or delete", DROP CONSTRAINT "document: upsert needs a JSON object", DROP CONSTRAINT "document: delete must not carry one", DROP CONSTRAINT "headers: must be a JSON object", DROP CONSTRAINT "index_name: not a valid Elasticsearch index name"`},
	} {
		b.Run(v.name, func(b *testing.B) {
			e := setupOutbox(b)
			if v.sql != "" {
				if _, err := e.pool.Exec(b.Context(), fmt.Sprintf(v.sql, e.outbox.Schema())); err != nil {
					b.Fatal(err)
				}
			}
			benchAppendOverhead(b, e, false)
		})
	}
}
