// Package repair holds outboxd's operator tools for an Elasticsearch index
// the sink (package indexer) writes: duplicate repair with backup, restore
// and an audit log, progress reporting, and reconcile against PostgreSQL.
// They share the sink's client, bulk item type and version-conflict
// parser; the sink never depends on them.
//
// PlanDuplicates scans every concrete index behind a name (point in time and
// search_after, a few dozen bytes of state per document), groups documents
// by a key and picks one keeper per group; it changes nothing. Apply writes
// and fsyncs a backup of every document it will touch before it touches
// any, appends each step to an audit log, re-submits the keeper under
// _id = key at its business version (1 when it has none: a legacy
// _version counts writes and must not make the outbox's events stale), and
// deletes the others only if unchanged since the scan (if_seq_no +
// if_primary_term): a document changed meanwhile is skipped and reported,
// never lost. It then records in the backup the coordinates its writes
// left. Restore undoes those writes and nothing else: a group whose
// document changed since the repair (an outbox update or delete) is skipped
// and reported. Elasticsearch cannot lower a version, so a document may
// come back with its source and _id at a higher _version (reported as
// raised).
//
// Reconcile compares the rows of a SQL query with the index and fixes drift
// only by appending outbox events at versions that win the version gate, so
// every fix takes the same path as ordinary writes.
package repair
