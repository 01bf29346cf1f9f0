// Package schema holds outboxd's SQL: the migrations that create the outbox
// tables and the SQL API (append, capture, uncapture), embedded in the
// binary.
//
// Every object lives in one schema whose name is chosen at migration time
// (default "outbox"). The name is quoted everywhere, so "Outbox" or
// "my outbox" work; a name with a single quote, a $ or a NUL byte is
// refused because it also appears inside SQL string literals and
// $$-quoted function bodies.
//
// Migrate is safe to run concurrently from several processes: it takes a
// transaction-scoped advisory lock per schema, applies what is missing in
// one transaction and records each version in schema_migrations. Running it
// again is a no-op.
package schema
