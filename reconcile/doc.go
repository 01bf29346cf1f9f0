// Package reconcile compares the rows of a query, the database's truth,
// with every document behind an index name, and reports the drift:
// missing, stale, extra, resurrected, duplicate and ahead documents.
//
// Reconcile fixes drift only by appending outbox events that win the
// version gate: with Options.Apply, each fixable drift becomes an upsert or
// a delete of _id = source_id at a version no lower than what the index
// holds, appended in batches in one transaction each (with the outbox's
// versions counter raised to it and an audit_log row), so every fix takes
// the path of ordinary writes and the relay delivers it. It never writes to
// Elasticsearch itself. Duplicates, and drifts whose visible copy is not at
// _id = source_id in the write index, are reported, not fixed: an event
// addresses only _id = source_id, and package repair handles the rest.
//
// The index is scanned first into a few integers per source_id (memory
// grows with keys, not documents), then the query is streamed against
// them in a READ ONLY transaction with a statement timeout. reconcile.go
// finds the drift, fix.go appends the fixes.
//
// A definition-fed index (package documents) is compared with its
// definition instead, and refuses a query (definition.go): the ids of its
// ids query, then those the index shows and the query did not list, are
// read from the definition in batches, each read at a version of its own
// as the relay reads, and compared with the write index's copy fetched
// after the read. Missing, stale (other content below the read's version)
// and extra (no document, a live copy below the read's version) are fixed
// by a refresh event each: the relay reads the id again, above every
// earlier read, so the fix wins over the copy it replaces and never over a
// newer one.
package reconcile
