package repair

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Summary counts a plan.
type Summary struct {
	Scanned     int64 `json:"scanned"`
	Keys        int64 `json:"keys"`
	Ungroupable int64 `json:"ungroupable"`
	KeyedByID   int64 `json:"keyed_by_id"`
	Groups      int   `json:"groups"`     // groups needing work
	Duplicated  int   `json:"duplicated"` // groups with more than one document
	Remove      int   `json:"remove"`
	Rewrite     int   `json:"rewrite"`
	Create      int   `json:"create"`
	Deleted     int   `json:"stays_deleted"`
	Conflicts   int   `json:"conflicts"`
}

// Summary counts the plan.
func (p *Plan) Summary() Summary {
	s := Summary{Scanned: p.Scanned, Keys: p.Keys, Ungroupable: p.Ungroupable, KeyedByID: p.KeyedByID, Groups: len(p.Groups)}
	for _, g := range p.Groups {
		if g.Conflict != "" {
			s.Conflicts++
			continue
		}
		n := len(g.Remove) + 1
		if g.Overwrites != nil {
			n++
		}
		if n > 1 {
			s.Duplicated++
		}
		s.Remove += len(g.Remove)
		if g.Rewrite {
			s.Rewrite++
			if g.Overwrites == nil {
				s.Create++
			}
		}
		if g.Deleted {
			s.Deleted++
		}
	}
	return s
}

// WriteText prints the plan for an operator: one block per group with the
// keeper and why it won, then the summary.
func (p *Plan) WriteText(w io.Writer) error {
	bw := &errWriter{w: w}
	for _, g := range p.Groups {
		fmt.Fprintf(bw, "group %q\n", g.Key)
		if g.Conflict != "" {
			fmt.Fprintf(bw, "  SKIP: %s\n", g.Conflict)
		}
		what := "keep"
		if g.Deleted {
			what = "keep tombstone"
		}
		fmt.Fprintf(bw, "  %s %s/%s (version %d, _version %d): %s\n", what, g.Keeper.Index, g.Keeper.ID, g.Keeper.Version, g.Keeper.ESVersion, g.Reason)
		if g.Rewrite {
			if g.Overwrites != nil {
				fmt.Fprintf(bw, "  rewrite as %s/%s at version %d (%s), replacing _version %d\n", p.WriteIndex, g.TargetID, g.Version, g.VersionReason, g.Overwrites.ESVersion)
			} else {
				fmt.Fprintf(bw, "  rewrite as %s/%s at version %d (%s; new _id)\n", p.WriteIndex, g.TargetID, g.Version, g.VersionReason)
			}
		}
		for _, d := range g.Remove {
			kind := ""
			if d.Tombstone {
				kind = " tombstone"
			}
			fmt.Fprintf(bw, "  remove%s %s/%s (version %d, _seq_no %d)\n", kind, d.Index, d.ID, d.Version, d.SeqNo)
		}
	}
	s := p.Summary()
	missing := "left alone"
	switch {
	case p.IncludeMissingKey:
		missing = fmt.Sprintf("left alone; %d more without a source_id field grouped by _id", s.KeyedByID)
	case slices.Contains(p.Key, "source_id"):
		missing = "left alone; --include-missing-key groups those without a source_id field by _id"
	}
	fmt.Fprintf(bw, "summary: index %s (%s), key %s: scanned %d documents, %d keys, %d without key (%s); %d groups to repair (%d with duplicates, %d stay deleted, %d conflicts skipped): remove %d documents, rewrite %d keepers (%d new _ids)\n",
		p.Index, strings.Join(p.Indices, ","), strings.Join(p.Key, ","), s.Scanned, s.Keys, s.Ungroupable, missing, s.Groups, s.Duplicated, s.Deleted, s.Conflicts, s.Remove, s.Rewrite, s.Create)
	return bw.err
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}
