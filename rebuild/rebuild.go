package rebuild

import (
	"context"
	"fmt"
	"time"
)

// Run creates the next concrete index of o.Index with new mappings or
// settings, fills it while the relay keeps writing through N-write, and
// moves N, N-write and N-read to it in one atomic _aliases request.
//
// No write is lost, without dual writes: before the copy starts each
// shard's global checkpoint of the old index is recorded (every write up
// to it is visible after a refresh); after the copy, catch-up rounds copy the
// old index's documents with a higher _seq_no, shard by shard, and advance
// the checkpoints. Every copy is a versioned write (external_gte at the
// document's own version), so order does not matter: a copy older than
// what the new index holds loses. After the swap, writes still in flight
// to the old index are picked up by one final catch-up after Grace, and
// again by DropOld before the old index is deleted.
//
// The state is stored in <schema>.rebuilds; killed at any point, a rerun
// with the same options continues (an interrupted copy starts over into the
// same new index, an interrupted catch-up continues from its checkpoints)
// and N always points at a complete index. The package doc lists the
// phases, one file each.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if err := o.lookup(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	st, unlock, err := openStore(ctx, o.Pool, o.Schema, o.Index)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rep := &Report{Index: o.Index, Run: st.run}
	o.Logger = o.Logger.With("run", st.run)
	r := &runner{o: o, st: st}
	otherOptions, err := r.plan(ctx, rep)
	if err != nil {
		return nil, err
	}
	cur := r.cur
	if cur.Phase == PhaseCopying {
		if err := r.copyAll(ctx, rep); err != nil {
			return rep, err
		}
	}
	if cur.Phase == PhaseCatchingUp {
		if err := r.catchUpRounds(ctx, rep); err != nil {
			return rep, err
		}
		rep.Rejected, rep.Samples = cur.Rejected, cur.Samples
		if cur.Rejected > 0 && !o.AcceptRejected {
			return rep, &RejectedError{Index: o.Index, Rejected: cur.Rejected}
		}
		if err := r.swap(ctx); err != nil {
			return rep, err
		}
		rep.Swapped = true
	}
	if cur.Phase == PhaseSwapped {
		if err := r.finish(ctx, rep); err != nil {
			return rep, err
		}
	}
	rep.Rejected, rep.Samples = cur.Rejected, cur.Samples
	rep.Seconds = time.Since(start).Seconds()
	o.Logger.Info("rebuild finished", "index", o.Index, "old_index", cur.Old, "new_index", cur.New,
		"copied", rep.Copied, "caught_up", rep.CaughtUp, "rejected", rep.Rejected)
	if otherOptions {
		return rep, fmt.Errorf("indexer: rebuild %s: finished an interrupted earlier rebuild into %s, which was already swapped; it was started with other mappings, settings or source, so these were NOT applied: run the command again to rebuild with them (drop the old index %s first if it is kept)", o.Index, cur.New, cur.Old)
	}
	return rep, nil
}

// runner is one run of a rebuild: its options, its hold on the rebuilds
// table's row, and the row.
type runner struct {
	o   Options
	st  *store
	cur *record
}
