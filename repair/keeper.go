package repair

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/scan"
)

// ParseKey parses --key: source_id, canonical_url, or a
// comma-separated list of fields forming a business key.
func ParseKey(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return []string{"source_id"}, nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			return nil, fmt.Errorf("key: %q has an empty field name", s)
		}
		if strings.HasPrefix(f, "_") {
			return nil, fmt.Errorf("key: %q is a metadata field; use source_id for _id-based grouping", f)
		}
		out = append(out, f)
	}
	return out, nil
}

// updatedLess compares updated-at values: as RFC 3339 times when
// both parse, as integers (epoch) when both are, else as strings. An empty
// value is older than any value.
func updatedLess(a, b string) bool {
	if a == "" || b == "" {
		return a == "" && b != ""
	}
	if ta, err := time.Parse(time.RFC3339Nano, a); err == nil {
		if tb, err := time.Parse(time.RFC3339Nano, b); err == nil {
			return ta.Before(tb)
		}
	}
	if na, err := strconv.ParseFloat(a, 64); err == nil {
		if nb, err := strconv.ParseFloat(b, 64); err == nil {
			return na < nb
		}
	}
	return a < b
}

// compare says whether a ranks before b, and why, by the first of
// these rules that tells them apart:
//
//  1. a business version beats none: a write count is no business version;
//  2. higher business version;
//  3. newer updated-at value;
//  4. without business versions, more writes (_version): the copy the
//     legacy writer kept editing;
//  5. a document already at _id = source_id beats one at a random _id;
//  6. a document in the write index beats one in an older index;
//  7. smaller index name, then smaller _id (only so the choice is
//     deterministic).
func compare(a, b scan.Doc, writeIndex, updatedField string) (less bool, why string) {
	switch {
	case a.Versioned != b.Versioned:
		v, n := a, b
		if b.Versioned {
			v, n = b, a
		}
		return a.Versioned, fmt.Sprintf("business version %d; a copy without one (_version %d counts writes) cannot be newer", v.Version, n.Version)
	case a.Versioned && a.Version != b.Version:
		return a.Version > b.Version, fmt.Sprintf("highest version %d (next %d)", max(a.Version, b.Version), min(a.Version, b.Version))
	case updatedLess(b.Updated, a.Updated):
		return true, fmt.Sprintf("%s; newest %s %s (next %q)", versionTie(a), updatedField, a.Updated, b.Updated)
	case updatedLess(a.Updated, b.Updated):
		return false, fmt.Sprintf("%s; newest %s %s (next %q)", versionTie(a), updatedField, b.Updated, a.Updated)
	case a.Version != b.Version:
		return a.Version > b.Version, fmt.Sprintf("no business version; most writes (_version %d, next %d)", max(a.Version, b.Version), min(a.Version, b.Version))
	}
	if ac, bc := a.ID == a.SourceID, b.ID == b.SourceID; ac != bc {
		return ac, fmt.Sprintf("%s and %s tie; _id equals source_id", versionTie(a), updatedField)
	}
	if aw, bw := a.Index == writeIndex, b.Index == writeIndex; aw != bw {
		return aw, fmt.Sprintf("%s and %s tie; already in the write index", versionTie(a), updatedField)
	}
	if a.Index != b.Index {
		return a.Index < b.Index, fmt.Sprintf("full tie at %s; first by index and _id", versionTie(a))
	}
	return a.ID < b.ID, fmt.Sprintf("full tie at %s; first by index and _id", versionTie(a))
}

func versionTie(d scan.Doc) string {
	if d.Versioned {
		return fmt.Sprintf("version tie at %d", d.Version)
	}
	return "no business version"
}

// rank orders the documents of one group best first (see
// compare) and says why the first one is best. Tombstones and live
// documents are ranked separately by chooseKeeper.
func rank(docs []scan.Doc, writeIndex, updatedField string) string {
	sort.SliceStable(docs, func(i, j int) bool {
		less, _ := compare(docs[i], docs[j], writeIndex, updatedField)
		return less
	})
	if len(docs) < 2 {
		return "only candidate"
	}
	_, why := compare(docs[0], docs[1], writeIndex, updatedField)
	return why
}

// atLeastAsNew reports whether tombstone t is at least as new as
// live document l: a business version beats none, then versions compare.
func atLeastAsNew(t, l scan.Doc) bool {
	if t.Versioned != l.Versioned {
		return t.Versioned
	}
	return t.Version >= l.Version
}

// chooseKeeper picks the keeper of a group: it returns the keeper,
// the others, whether the outcome is "stays deleted", and the reason.
//
// Live documents are ranked among themselves, tombstones among
// themselves. A tombstone is an "invalid" document and never wins over a
// live one by the ordinary rules, with one exception that matters: when
// the newest tombstone's version is at least the newest live version (a
// business version counting as newer than none; see atLeastAsNew), the
// source was deleted after (or at the same version as) every live copy was
// written. Keeping a live copy would be a resurrection, exactly what the
// versioned pipeline exists to prevent, so the tombstone is the keeper
// and the key stays deleted. A tie goes to the tombstone for the same
// reason; the backup can undo a wrong delete, while a resurrection is
// served to searchers at once.
func chooseKeeper(docs []scan.Doc, writeIndex, updatedField string) (keeper scan.Doc, others []scan.Doc, deleted bool, reason string) {
	var live, dead []scan.Doc
	for _, d := range docs {
		if d.Tombstone {
			dead = append(dead, d)
		} else {
			live = append(live, d)
		}
	}
	liveWhy := rank(live, writeIndex, updatedField)
	deadWhy := rank(dead, writeIndex, updatedField)
	switch {
	case len(live) == 0:
		keeper, others = dead[0], dead[1:]
		return keeper, others, true, "only tombstones; the newest is kept (" + deadWhy + ")"
	case len(dead) > 0 && atLeastAsNew(dead[0], live[0]):
		keeper = dead[0]
		others = append(append(others, dead[1:]...), live...)
		newest := fmt.Sprintf("version %d", live[0].Version)
		if !live[0].Versioned {
			newest = "no business version"
		}
		return keeper, others, true, fmt.Sprintf("tombstone at version %d is at least as new as the newest live copy (%s): the key stays deleted", dead[0].Version, newest)
	default:
		keeper = live[0]
		others = append(append(others, live[1:]...), dead...)
		why := liveWhy
		if len(dead) > 0 {
			why += fmt.Sprintf("; newer than the tombstone at version %d", dead[0].Version)
		}
		return keeper, others, false, why
	}
}
