package repair

import "time"

// repairSlot is the compact form of a RepairDoc held per scanned document
// while grouping: 64 bytes, stored inline in the map (no allocation per
// key), with the rare second and later documents of a key chained in an
// overflow slice. With 200k documents the whole grouping state is a few
// tens of megabytes.
//
// The rare values that do not fit (a source_id that is neither the _id nor
// the key, an updated-at that is not an RFC 3339 time) live in side maps.
type repairSlot struct {
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
	repairSlotTombstone = 1 << iota
	repairSlotUpdatedNS
	repairSlotSourceIsKey // source_id is the group key (key source_id, legacy _id)
	repairSlotSourceOther // source_id in sourceIDs
	repairSlotUpdatedRaw  // updated-at in updatedRaw
)

// repairGrouper groups RepairDocs by key.
type repairGrouper struct {
	indices  []string
	indexID  map[string]uint16
	slots    map[string]repairSlot
	overflow []repairSlot
	buf      []RepairDoc
	// Side maps for the rare values, by index and _id.
	sourceIDs  map[repairRef]string
	updatedRaw map[repairRef]string
}

func newRepairGrouper() *repairGrouper {
	return &repairGrouper{indexID: map[string]uint16{}, slots: map[string]repairSlot{}, sourceIDs: map[repairRef]string{}, updatedRaw: map[repairRef]string{}}
}

func (g *repairGrouper) add(key string, d RepairDoc) {
	idx, ok := g.indexID[d.Index]
	if !ok {
		idx = uint16(len(g.indices))
		g.indices = append(g.indices, d.Index)
		g.indexID[d.Index] = idx
	}
	s := repairSlot{id: d.ID, seqNo: d.SeqNo, esVersion: d.ESVersion, version: d.Version, term: int32(d.PrimaryTerm), index: idx}
	switch {
	case d.SourceID == d.ID:
		if key == d.ID {
			key = d.ID // share one string between the map key and the slot
		}
	case d.SourceID == key:
		s.flags |= repairSlotSourceIsKey
	default:
		s.flags |= repairSlotSourceOther
		g.sourceIDs[repairRef{d.Index, d.ID}] = d.SourceID
	}
	if d.Tombstone {
		s.flags |= repairSlotTombstone
	}
	if d.Updated != "" {
		if t, err := time.Parse(time.RFC3339Nano, d.Updated); err == nil {
			s.updatedNS = t.UnixNano()
			s.flags |= repairSlotUpdatedNS
		} else {
			s.flags |= repairSlotUpdatedRaw
			g.updatedRaw[repairRef{d.Index, d.ID}] = d.Updated
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

func (g *repairGrouper) doc(key string, s repairSlot) RepairDoc {
	d := RepairDoc{Index: g.indices[s.index], ID: s.id, SourceID: s.id, SeqNo: s.seqNo, ESVersion: s.esVersion, Version: s.version, PrimaryTerm: int64(s.term), Tombstone: s.flags&repairSlotTombstone != 0}
	switch {
	case s.flags&repairSlotSourceIsKey != 0:
		d.SourceID = key
	case s.flags&repairSlotSourceOther != 0:
		d.SourceID = g.sourceIDs[repairRef{d.Index, d.ID}]
	}
	switch {
	case s.flags&repairSlotUpdatedNS != 0:
		d.Updated = time.Unix(0, s.updatedNS).UTC().Format(time.RFC3339Nano)
	case s.flags&repairSlotUpdatedRaw != 0:
		d.Updated = g.updatedRaw[repairRef{d.Index, d.ID}]
	}
	return d
}

// each calls fn once per key with its documents, except keys whose only
// document is already at _id = source_id in writeIndex (nothing to do; no
// need to expand them). The slice is reused between calls: fn must copy
// what it keeps.
func (g *repairGrouper) each(writeIndex string, fn func(key string, docs []RepairDoc)) {
	for k, s := range g.slots {
		if s.next == 0 && s.flags&(repairSlotSourceIsKey|repairSlotSourceOther) == 0 && g.indices[s.index] == writeIndex {
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
func (g *repairGrouper) eachDoc(fn func(key, index, id string)) {
	for k, s := range g.slots {
		fn(k, g.indices[s.index], s.id)
		for n := s.next; n != 0; n = g.overflow[n-1].next {
			o := g.overflow[n-1]
			fn(k, g.indices[o.index], o.id)
		}
	}
}
