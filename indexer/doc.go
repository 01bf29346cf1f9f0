// Package indexer is outboxd's Elasticsearch and OpenSearch side: the Sink
// the relay writes to, index bootstrap, tombstone purge, and the client.
// "Elasticsearch" below means either server unless OpenSearch is named.
//
// # One client for both servers
//
// outboxd keeps go-elasticsearch/v8 for OpenSearch 2.x and 3.x too. The
// requests the sink and the tools send (_bulk with external versions and
// require_alias, _mget, filtered aliases, _resolve/index, _seq_no queries,
// scroll, _stats, index templates) are the APIs both servers inherited
// from Elasticsearch 7.10, with the same JSON; the only obstacle is the
// v8 client's product check, which refuses any answer without
// "X-Elastic-Product: Elasticsearch" and has no switch. productTransport
// (client.go) supplies that header below the client, so the typed esapi
// requests, the transport settings (TLS, timeouts, no transport retries)
// and the request signing for Amazon OpenSearch Service stay one code
// path. opensearch-go/v4 would have meant a second client behind an
// interface for every request type the tools use (some twenty), with the
// version gate and its parsing written twice; the few real differences are
// better handled where they are: detectVersion (version.go) reads the
// product from GET / ("distribution": "opensearch") and the oldest node's
// version, and only the parameters that server accepts are sent
// (include_source_on_error: Elasticsearch 8.18 and later only). The
// operator tools' consistent scan uses a point in time sorted by
// _shard_doc on Elasticsearch and a scroll on OpenSearch, which has no
// _shard_doc. The gate (gate.go) is the same for both.
//
// # Layout in Elasticsearch
//
// An event's index name N is what applications search: a filtered alias
// (ReadFilter) over one concrete index N-000001, so tombstones never show
// up in a search, count or aggregation on N. outboxd writes and reads
// tombstones through the unfiltered write alias N-write (is_write_index);
// N-read is the filtered view under the name earlier releases searched.
// GET and _mget ignore alias filters: a GET of a deleted id on N returns
// its tombstone, which callers treat as absent. Bootstrap creates the
// index and the three aliases on first use, upgrades the layout of
// earlier releases (N the unfiltered write alias) in place with one atomic
// _aliases request, and refuses, changing nothing, an N that is a concrete
// index, an alias over several indices (versions are only compared within
// one index, so rollover is not supported; a rebuild moves all three names
// at once instead), an alias of the layout
// pointing at another index, or an N-read with another filter.
//
// # Versions
//
// A document's _id is the event's source_id and its Elasticsearch version
// the event's version (external versioning). An upsert indexes the event's
// document as is; a delete at version V indexes the tombstone
// {"outboxd_deleted":true,"outboxd_deleted_at":"<UTC time>"} at version V
// (TombstoneField, TombstoneAtField).
// Elasticsearch keeps the version of a real delete only for
// index.gc_deletes and only in memory; a tombstone is an ordinary document
// and keeps its version forever, across restarts, so an older upsert can
// never resurrect a deleted document. PurgeTombstones removes tombstones
// older than a horizon, each only at its own version.
//
// The rule is "the event's version >= the stored one wins". The sink first
// sends with version_type=external (strict >): a lower version comes back
// 409 and is Stale; an equal version also comes back 409 and the sink
// reads the stored document: same content means a replay or duplicate,
// reported Stale with nothing written; different content under the same
// version is re-sent with external_gte, so the later write wins. Replays
// thus cost one extra _mget per replayed batch and never rewrite anything.
// gate.go holds the whole rule, top to bottom.
//
// # Outcomes
//
// Write returns one outbox.Outcome per event: 200/201 Applied; version
// conflicts Stale; 429, 408, 5xx items Retry; 400 items (mapping and
// parse errors) and malformed events Rejected with Elasticsearch's error
// type and reason (the document itself is not echoed:
// include_source_on_error=false on servers from 8.18, which the sink
// detects once; Elasticsearch may quote a short preview of the offending
// field). A bulk request that fails as a whole (any HTTP error, a timeout,
// a reset connection) is judged by a one-item probe that writes nothing
// (probe.go): if the probe fails too, the cluster or the configuration is
// at fault and the events get Retry with Outage (408, 429, 5xx, no
// connection), or Write returns a *ConfigError (400, 401, 403, 404: a
// parameter, credentials, a proxy path); if it passes, the request is
// halved until the event that fails alone is found, which is Rejected
// (400, 413) or charged a Retry, so one event never stalls its stream.
// When no request reached Elasticsearch Write returns an *UnavailableError;
// with either error there are no outcomes, and the relay retries without
// counting attempts.
// Within one Write, several events of one document are deduplicated: only
// the highest version (the later one on a tie) is sent; the others get its
// outcome, Applied becoming Stale, except that when it is Rejected they are
// sent in their own right. The sink never loops: retrying is the relay's
// job.
//
// # Why not esutil.BulkIndexer
//
// BulkIndexer suits fire-and-forget loading, not a sink that must answer
// per event and synchronously: it reports 404 and 409 items through
// OnFailure like real failures, never retries items, buffers across calls
// so a Write could not return its outcomes without flushing everything,
// and its transport retries whole requests (re-sending items that already
// succeeded). The sink's own loop on esapi.BulkRequest builds the ndjson
// body by appending to pooled buffers (no encoding/json per event), asks
// only for items.*.status and errors through filter_path, recognizes a
// fully successful answer without decoding it, sends with require_alias
// so a vanished alias never auto-creates a concrete index named N, and
// runs Options.Workers requests at once; Write returns when all are done,
// which is the back-pressure the relay needs. Write is safe to call
// concurrently (the relay keeps several pages in flight).
//
// # Documents PostgreSQL validated
//
// A document must be a JSON object on one line. Parsing it again is most
// of the sink's own CPU for documents of a kilobyte, and it is wasted on a
// document PostgreSQL produced from a json or jsonb value. Options.JSONB
// is the one switch that says so, for every document the sink will see:
// the relay's all come from outbox.events.document (jsonb), and a
// backfill's from one query's document column, whose type
// backfill.ValidJSON reads before the sink is built. A per-call variant
// of Write (as backfill once used) would be a second protocol beside the
// relay.Sink interface, invisible to the relay, which calls only Write;
// whoever builds a sink knows where its documents come from, once.
// The sink still requires an object, refuses reserved fields and folds a
// document with newlines onto one line. A sink built with JSONB for
// documents of a text column does not stall on one that is not JSON:
// Elasticsearch refuses it as a document it cannot parse (one with a
// newline arrives empty), and that event alone is Rejected.
//
// # Rebuild
//
// Package rebuild moves a name to new mappings or settings: it creates the next
// concrete index (N-000002 after N-000001), copies the current one into it
// (or the rows of a query plus the current index's tombstones) at each
// document's own version with external_gte, catches up by _seq_no above
// per-shard global checkpoints recorded before the copy, and moves N,
// N-write and N-read in one _aliases request whose remove of N-write must
// find it on the old index. Versions make the order of copies and live
// writes irrelevant. Writes that reached the old index just before the
// swap are copied by a final catch-up and again before rebuild.DropOld
// deletes it. The state is a row of <schema>.rebuilds; a rebuild killed
// at any point continues when run again, and N always points at a
// complete index.
//
// # Operator tools
//
// The operator tools are packages of their own, one per tool, beside this
// one: repair (duplicate repair, backup, restore, audit log), rebuild,
// backfill and reconcile, with what they share under internal/ (scan,
// progress, source). They use the sink's client, bulk item type, version
// gate and version-conflict parser; the sink never depends on them.
package indexer
