// Package documents keeps search documents built from several tables in
// step with them: a document is declared once, as SQL, and the relay
// reads it again whenever a change may have touched it.
//
// # Definitions
//
// A definition belongs to one index and returns (source_id text,
// document jsonb) for the ids given as $1 (text[]):
//
//	SELECT t.id::text, jsonb_build_object('title', t.title, 'author', a.name,
//	       'tags', (SELECT jsonb_agg(g.name) FROM tags g WHERE g.tutorial_id = t.id))
//	FROM tutorials t JOIN authors a ON a.id = t.author_id
//	WHERE t.id::text = ANY($1)
//
// Define stores it in <schema>.documents (who and when; the previous SQL is
// kept beside it and every change is an audit_log row) after checking it:
// it must prepare with $1 a text[], return exactly two columns, text then
// jsonb, and run in a READ ONLY transaction under a statement timeout on
// an empty id list, returning no row. A failed check is a
// *DefinitionError naming the reason. An index is event-fed (business
// events with business versions) or definition-fed, never both: Define
// refuses an index with upsert or delete events in the outbox
// (ErrEventFed), and while any definition exists a trigger on the events
// table refuses an upsert or delete for a defined index and a refresh of
// an undefined one.
//
// # Refreshes and watches
//
// A refresh event (SQL <schema>.refresh(index, source_id), Go
// outbox.Outbox.Refresh) says "this document may have changed"; it is
// appended in the business transaction, like an append, and carries no
// document. AddWatch installs statement-level triggers on a contributing
// table (one per event, with transition tables) that append the
// refreshes for the rows a statement changed: its key gives the source
// ids of a row, with $1 the row (a column, tutorial_id; an expression,
// $1.tutorial_id; or a query, SELECT t.id FROM tutorials t WHERE
// t.author_id = $1.id). INSERT and DELETE refresh the rows' ids, UPDATE
// those of the old rows and of the new ones (a child moved to another
// parent refreshes both), each id once per statement, all with one
// INSERT ... SELECT; refresh()'s checks apply with its error texts. A
// row key is run once over the whole transition table ($1 rewritten to
// its row; $1 inside a quoted string is left alone). The rewrite knows
// '...' strings and "..." identifiers only, so AddWatch refuses a row key
// with an E'...' string, a dollar-quoted string or a comment outside
// them, and runs the statement the trigger will EXECUTE (watch_statement
// builds it for both) over no rows before installing: a key the rewrite
// breaks is refused with PostgreSQL's message and nothing is installed.
// TRUNCATE is not watched.
//
// A column or expression key reads only the row, and the trigger appends
// its refreshes. A query key reads other tables, and run in the trigger it
// would miss links that concurrent transactions are making: an author is
// renamed while a tutorial, not yet committed, moves to that author; the
// move commits, the relay reads the tutorial with the old name, the rename
// commits, and its trigger never saw the tutorial. So the trigger appends
// one fan-out refresh per distinct changed row of the statement, carrying
// the row (its text form, in the headers; a row an UPDATE left unchanged
// is carried once, as its old row),
// and the relay runs the key query in the snapshot of its read, which
// sees the rename: a link committed before that snapshot is found, and one
// committed after it has a refresh of its own, read later still. Every
// table a definition reads must be watched (or refreshed by hand).
//
// # Delivery and versions
//
// Sink wraps the Elasticsearch sink (indexer.Sink). For each index with
// refreshes in a page it reads the distinct ids in one query (Reader.Read),
// then writes, through the same version gate as every other write, an
// upsert of each document returned and a delete (a tombstone) for each id
// the definition no longer returns, all at the read's version. Every
// refresh of an id, however many in the page, gets that write's outcome.
// Non-refresh events pass through unchanged, in the same bulk requests.
//
// A read's version must order the reads themselves: if read B took its
// snapshot after read A, B must carry the higher version, or A's older
// documents could win in the gate. Read guarantees it like this:
//
//  1. it takes a session advisory lock (one per outbox schema) before
//     BEGIN ISOLATION LEVEL REPEATABLE READ, so the transaction's snapshot,
//     taken by its first statement, is taken while the lock is held;
//  2. that first statement also draws the version, from the sequence
//     <schema>.document_reads: v = setval(max(nextval, now in
//     microseconds));
//  3. it releases the lock, then runs the definition (READ ONLY, with a
//     statement timeout) in that snapshot.
//
// Snapshots and versions are thus drawn together, one read at a time:
// whichever read gets the lock later has both the later snapshot (which
// sees everything the earlier one saw, and more) and the greater version,
// whatever order the reads then finish, are retried or reach
// Elasticsearch in, on any relay. The sequence is not transactional and
// setval makes each value above the last one handed out, so versions
// never repeat across pages, relay restarts or crashes (the read
// transaction commits, flushing the sequence's WAL, before its version is
// used). Across a PostgreSQL failover the sequence continues from what the
// standby replayed; with asynchronous replication that may be behind the
// old primary's last values, which is why a version is never below the
// clock in microseconds: the promoted server's clock is past every value
// the old primary handed out unless their clocks differ by more than the
// failover took. Versions are microsecond timestamps in magnitude
// (10^15), far above business versions and below Elasticsearch's 2^63.
//
// A read that fails for a reason that says nothing about the definition (a
// lost connection, a timeout, a serialization failure) is retried by the
// relay; a definition that fails (a dropped column, a data error) or is
// gone parks the refreshes as dead letters with the reason. An id the
// definition returns twice or with a NULL document is refused alone.
//
// The lock is held only between BEGIN and the first statement: reads of
// several relays and pages run their definitions concurrently.
package documents
