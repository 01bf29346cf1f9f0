package relay

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Snapshot is a parsed pg_snapshot: xids below Xmin are finished, xids at
// or above Xmax had not started, and Xip lists those in progress between.
type Snapshot struct {
	Xmin, Xmax uint64
	Xip        []uint64 // sorted
}

// emptySnapshot sees no transaction at all: a new stream starts from it and
// so delivers every retained event.
var emptySnapshot = Snapshot{Xmin: 1, Xmax: 1}

// ParseSnapshot parses pg_snapshot's text form "xmin:xmax:xip,xip".
func ParseSnapshot(s string) (Snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Snapshot{}, fmt.Errorf("relay: snapshot %q: want xmin:xmax:xip", s)
	}
	var snap Snapshot
	var err error
	if snap.Xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("relay: snapshot %q: xmin: %w", s, err)
	}
	if snap.Xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("relay: snapshot %q: xmax: %w", s, err)
	}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return Snapshot{}, fmt.Errorf("relay: snapshot %q: xip: %w", s, err)
			}
			snap.Xip = append(snap.Xip, v)
		}
		slices.Sort(snap.Xip)
	}
	return snap, nil
}

func (s Snapshot) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatUint(s.Xmin, 10))
	b.WriteByte(':')
	b.WriteString(strconv.FormatUint(s.Xmax, 10))
	b.WriteByte(':')
	for i, x := range s.Xip {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(x, 10))
	}
	return b.String()
}

// Visible reports whether transaction xid had committed (or aborted) as of
// the snapshot, matching pg_visible_in_snapshot.
func (s Snapshot) Visible(xid uint64) bool {
	if xid < s.Xmin {
		return true
	}
	if xid >= s.Xmax {
		return false
	}
	_, found := slices.BinarySearch(s.Xip, xid)
	return !found
}

// Equal reports whether both snapshots see the same transactions.
func (s Snapshot) Equal(o Snapshot) bool {
	return s.Xmax == o.Xmax && s.Xmin == o.Xmin && slices.Equal(s.Xip, o.Xip)
}

// finishedSince lists the xids that were in progress in prev and are
// visible in cur: the late committers a batch must pick up.
func finishedSince(prev, cur Snapshot) []uint64 {
	var out []uint64
	for _, x := range prev.Xip {
		if cur.Visible(x) {
			out = append(out, x)
		}
	}
	return out
}
