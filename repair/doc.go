// Package repair merges the duplicate documents that older writers left
// in an index outboxd writes: one keeper per key at _id = source_id in the
// write index, with a backup, a restore and an audit log. Its siblings are
// the other operator tools: rebuild, backfill and reconcile.
//
// PlanDuplicates changes nothing. It scans every concrete index behind a
// name in one consistent view (internal/scan: a few dozen bytes of state
// per document, never a source), groups documents by a key and picks one
// keeper per group by the rules of keeper.go; a group whose rewrite would
// replace a document of another key, or one without the key, is a
// conflict and is left alone.
//
// Apply changes nothing before the backup of every document it will touch
// is written and fsynced. It re-submits a keeper that moves at its
// business version (1 when it has none: a legacy _version counts writes
// and must not make the outbox's events stale) with external_gte, so a
// newer document at the target wins; it deletes the others only if
// unchanged since the scan (if_seq_no + if_primary_term): a document
// changed meanwhile is skipped and reported, never lost. It appends each
// group to the audit log and records in the backup the coordinates every
// one of its writes left.
//
// Restore undoes the repair's own writes and nothing else: a group whose
// document changed since the repair (an outbox update or delete) is skipped
// and reported, and a backed-up document the repair did not write is left
// alone. Elasticsearch cannot lower a version, so a document may come back
// with its source and _id at a higher _version (reported as raised).
//
// Files: plan.go (PlanDuplicates), keeper.go (the ranking), group.go (the
// compact grouping state), summary.go (what a plan prints), apply.go,
// backup.go (the backup file and the conditional bulk writes), restore.go,
// audit.go.
package repair
