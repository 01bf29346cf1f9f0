package repair

import (
	"time"

	"github.com/outboxd/outboxd/internal/scan"
)

// slot is the compact form of a scan.Doc held per scanned document
// while grouping: 64 bytes, stored inline in the map (no allocation per
// key), with the rare second and later documents of a key chained in an
// overflow slice. With 200k documents the whole grouping state is a few
// tens of megabytes.
//
// The rare values that do not fit (a source_id that is neither the _id nor
// the key, an updated-at that is not an RFC 3339 time) live in side maps.
type slot struct {
	id        string
	updatedNS int64 // RFC 3339 updated-at as Unix nanoseconds
	seqNo     int64
	esVersion int64
	version   int64
	term      int32
	index     uint16
	flags     uint8
	next      int32 // 1 + overflow position of the key's next document; 0 = none
}

const (
	slotTombstone = 1 << iota
	slotUpdatedNS
	slotSourceIsKey // source_id is the group key (key source_id, legacy _id)
	slotSourceOther // source_id in sourceIDs
	slotUpdatedRaw  // updated-at in updatedRaw
	slotVersioned
)

// grouper groups Docs by key.
type grouper struct {
	indices  []string
	indexID  map[string]uint16
	slots    map[string]slot
	overflow []slot
	buf      []scan.Doc
	// Side maps for the rare values, by index and _id.
	sourceIDs  map[docRef]string
	updatedRaw map[docRef]string
}

func newGrouper() *grouper {
	return &grouper{indexID: map[string]uint16{}, slots: map[string]slot{}, sourceIDs: map[docRef]string{}, updatedRaw: map[docRef]string{}}
}

func (g *grouper) add(key string, d scan.Doc) {
	idx, ok := g.indexID[d.Index]
	if !ok {
		idx = uint16(len(g.indices))
		g.indices = append(g.indices, d.Index)
		g.indexID[d.Index] = idx
	}
	s := slot{id: d.ID, seqNo: d.SeqNo, esVersion: d.ESVersion, version: d.Version, term: int32(d.PrimaryTerm), index: idx}
	switch {
	case d.SourceID == d.ID:
		if key == d.ID {
			key = d.ID // share one string between the map key and the slot
		}
	case d.SourceID == key:
		s.flags |= slotSourceIsKey
	default:
		s.flags |= slotSourceOther
		g.sourceIDs[docRef{d.Index, d.ID}] = d.SourceID
	}
	if d.Tombstone {
		s.flags |= slotTombstone
	}
	if d.Versioned {
		s.flags |= slotVersioned
	}
	if d.Updated != "" {
		if t, err := time.Parse(time.RFC3339Nano, d.Updated); err == nil {
			s.updatedNS = t.UnixNano()
			s.flags |= slotUpdatedNS
		} else {
			s.flags |= slotUpdatedRaw
			g.updatedRaw[docRef{d.Index, d.ID}] = d.Updated
		}
	}
	if head, ok := g.slots[key]; ok {
		// Chain the new document behind the head.
		s.next = head.next
		g.overflow = append(g.overflow, s)
		head.next = int32(len(g.overflow))
		g.slots[key] = head
		return
	}
	g.slots[key] = s
}

func (g *grouper) doc(key string, s slot) scan.Doc {
	d := scan.Doc{Index: g.indices[s.index], ID: s.id, SourceID: s.id, SeqNo: s.seqNo, ESVersion: s.esVersion, Version: s.version, PrimaryTerm: int64(s.term), Tombstone: s.flags&slotTombstone != 0, Versioned: s.flags&slotVersioned != 0}
	switch {
	case s.flags&slotSourceIsKey != 0:
		d.SourceID = key
	case s.flags&slotSourceOther != 0:
		d.SourceID = g.sourceIDs[docRef{d.Index, d.ID}]
	}
	switch {
	case s.flags&slotUpdatedNS != 0:
		d.Updated = time.Unix(0, s.updatedNS).UTC().Format(time.RFC3339Nano)
	case s.flags&slotUpdatedRaw != 0:
		d.Updated = g.updatedRaw[docRef{d.Index, d.ID}]
	}
	return d
}

// each calls fn once per key with its documents, except keys whose only
// document is already at _id = source_id in writeIndex (nothing to do; no
// need to expand them). The slice is reused between calls: fn must copy
// what it keeps.
func (g *grouper) each(writeIndex string, fn func(key string, docs []scan.Doc)) {
	for k, s := range g.slots {
		if s.next == 0 && s.flags&(slotSourceIsKey|slotSourceOther) == 0 && g.indices[s.index] == writeIndex {
			continue
		}
		g.buf = append(g.buf[:0], g.doc(k, s))
		for n := s.next; n != 0; n = g.overflow[n-1].next {
			g.buf = append(g.buf, g.doc(k, g.overflow[n-1]))
		}
		fn(k, g.buf)
	}
}

// eachDoc calls fn for every document with its key, index and _id only.
func (g *grouper) eachDoc(fn func(key, index, id string)) {
	for k, s := range g.slots {
		fn(k, g.indices[s.index], s.id)
		for n := s.next; n != 0; n = g.overflow[n-1].next {
			o := g.overflow[n-1]
			fn(k, g.indices[o.index], o.id)
		}
	}
}
