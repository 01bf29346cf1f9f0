// Package rebuild moves an index name N to new mappings or settings while
// the relay keeps writing: it fills the next concrete index (N-000002
// after N-000001) from the current one or from a source query (for a
// definition-fed index, its document definition: definition.go), and moves
// N, N-write and N-read to it in one atomic _aliases request.
//
// Rebuild never deletes an index any of N, N-write, N-read points at:
// every delete (Abort's half-built index, DropOld's old one) goes through
// deleteUnaliased, which checks the three names right before it. No write
// is lost: every copy is versioned (external_gte at the document's own
// version), catch-up rounds copy what the old index took above each
// shard's recorded global checkpoint, and after the swap the old index's
// writes are blocked and one last catch-up copies what reached it late.
// One run, abort or drop of a name at a time: a session advisory lock,
// whose loss stops the run before its next change (ErrLostLock).
//
// The state is a row of <schema>.rebuilds; killed at any point, a rerun
// with the same options continues it, and N always points at a complete
// index. Run reads as its phases, one file each:
//
//   - plan.go: continue the name's unfinished rebuild, or begin the next:
//     its number, checkpoints, mappings and settings;
//   - copy.go (with writer.go, the bulk writer): fill the new index;
//   - catchup.go: copy what the old index took since the checkpoints;
//   - swap.go: move the three names at once;
//   - finish.go: block the old index's writes, catch up a last time, and
//     later drop it (DropOld);
//
// plus store.go (the row and its lock), names.go (alias lookups and the
// guarded delete), abort.go (Abort, Forget) and status.go (Home for the
// sink's bootstrap, Unfinished for status pages).
package rebuild
