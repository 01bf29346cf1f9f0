// Package scan is what the operator tools (repair, reconcile, rebuild)
// share to read an index: Each streams every document behind a name in
// one consistent view (a point in time sorted by _shard_doc on
// Elasticsearch, a scroll sorted by _doc on OpenSearch), with memory
// bounded by one page; Resolve finds the concrete indices and the write
// index behind a name; Key reads a hit's source_id, version, updated-at
// and tombstone flag into a Doc; Do, IsStatus, Count and CountQuery are
// the requests around them.
//
// Each never sees the writes made during the scan: a plan is computed on
// one snapshot, and a write based on it is made conditional on _seq_no.
package scan
