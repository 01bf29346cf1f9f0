// Package backfill loads the rows of a query into an index at bulk speed,
// as versioned upserts through the sink, without appending outbox events.
//
// Backfill writes every document through the version gate, one run per
// index at a time. A row older than a live event the relay delivers is
// stale, and a row deleted after it was read stays deleted; rows sent
// again after a restart are harmless for the same reason. A second run of
// an index is refused while the first holds its advisory lock, naming it,
// and a run that lost its lock, or whose progress another run took over,
// stops at its next progress write: the stored id only ever covers rows
// its own run's sink answered for.
//
// Rows are read in the id's own order through a server-side cursor
// (internal/source, shared with rebuild --from source), in batches bounded
// by rows and bytes, InFlight of them at the sink at once; after each
// batch the sink answered, in order, the last id is stored in
// <schema>.backfills, and a rerun continues after it. ValidJSON tells the
// caller whether the sink may be built with indexer.Options.JSONB.
//
// A definition-fed index (package documents) is loaded from its
// definition instead, with no SourceSQL (which it refuses; an index
// without a definition needs one): the ids of its ids query go through the
// same cursor and progress, and each batch's documents are read by
// documents.Reader, in a snapshot and at a version of its own drawn under
// the lock that orders every read of the schema, the relay's included. A
// backfilled document therefore loses the gate to a refresh read after it
// and wins over one read before it, in whatever order they reach
// Elasticsearch; an id the definition no longer returns is written as a
// delete (a tombstone) at the read's version. The progress row is tied to
// the definition and its ids query: a run of another one is not
// continued.
package backfill
