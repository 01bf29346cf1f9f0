package relay

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/outbox"
)

// rowDecoder turns a page query's rows (eventColumns) into events without
// pgx's per-column scan plans, which were a sixth of a backlog drain's CPU
// in this process, and with fewer allocations: a page's documents and
// headers share a few large buffers, and its index names, ops and event
// types (the same few strings in every row) are allocated once per page.
// It decodes only the formats it was built for, with pgx's own codecs
// for the types; any other row (a timestamp of ±infinity, a format the
// server chose otherwise, a pool whose type map has codecs of its own,
// such as a timestamptz ScanLocation) goes to rows.Scan, which knows them
// all.
type rowDecoder struct {
	ok bool // the columns are as expected: the fast path applies

	index, op, eventType string // the previous row's, to share
	buf                  []byte // where documents and headers are copied
}

// decoderColumns are eventColumns' types and formats, in order.
var decoderColumns = [...]struct {
	oid    uint32
	format int16
}{
	{pgtype.Int8OID, pgtype.BinaryFormatCode},        // id
	{pgtype.XID8OID, pgtype.BinaryFormatCode},        // xid
	{pgtype.TextOID, pgtype.TextFormatCode},          // index_name
	{pgtype.TextOID, pgtype.TextFormatCode},          // source_id
	{pgtype.Int8OID, pgtype.BinaryFormatCode},        // version
	{pgtype.TextOID, pgtype.TextFormatCode},          // op
	{pgtype.JSONBOID, pgtype.TextFormatCode},         // document
	{pgtype.TextOID, pgtype.TextFormatCode},          // event_type
	{pgtype.JSONBOID, pgtype.TextFormatCode},         // headers
	{pgtype.TimestamptzOID, pgtype.BinaryFormatCode}, // occurred_at
	{pgtype.TimestamptzOID, pgtype.BinaryFormatCode}, // created_at
}

// defaultTypes is pgx's type map as it comes: a connection whose map
// gives another Type for an OID was configured to scan it otherwise.
var defaultTypes = pgtype.NewMap()

func newRowDecoder(fields []pgconn.FieldDescription, types *pgtype.Map) *rowDecoder {
	d := &rowDecoder{ok: len(fields) == len(decoderColumns)}
	for i := 0; d.ok && i < len(fields); i++ {
		c := decoderColumns[i]
		d.ok = fields[i].DataTypeOID == c.oid && fields[i].Format == c.format && sameType(types, defaultTypes, c.oid)
	}
	return d
}

func sameType(a, b *pgtype.Map, oid uint32) bool {
	ta, ok := a.TypeForOID(oid)
	tb, _ := b.TypeForOID(oid)
	return ok && ta == tb
}

// decode fills e from one row's raw values and reports whether it could;
// when it could not, e is unchanged in what matters (the caller scans the
// row instead, which sets every field).
func (d *rowDecoder) decode(vals [][]byte, e *outbox.Event) bool {
	if !d.ok || len(vals) != len(decoderColumns) {
		return false
	}
	// The binary columns are 8 bytes (a NULL has none); the text columns
	// but document and headers are NOT NULL (coalesce makes event_type
	// one).
	for _, i := range [...]int{0, 1, 4, 9, 10} {
		if len(vals[i]) != 8 {
			return false
		}
	}
	if vals[2] == nil || vals[3] == nil || vals[5] == nil || vals[7] == nil {
		return false
	}
	occurred, ok1 := pgTime(vals[9])
	created, ok2 := pgTime(vals[10])
	if !ok1 || !ok2 {
		return false
	}
	e.ID = int64(binary.BigEndian.Uint64(vals[0]))
	e.XID = binary.BigEndian.Uint64(vals[1])
	d.index = shared(d.index, vals[2])
	e.IndexName = d.index
	e.SourceID = string(vals[3])
	e.Version = int64(binary.BigEndian.Uint64(vals[4]))
	d.op = shared(d.op, vals[5])
	e.Op = outbox.Op(d.op)
	e.Document = d.copyBytes(vals[6])
	d.eventType = shared(d.eventType, vals[7])
	e.EventType = d.eventType
	e.Headers = d.copyBytes(vals[8])
	e.OccurredAt, e.CreatedAt = occurred, created
	return true
}

// shared returns prev when b spells it (no allocation), else b as a new
// string.
func shared(prev string, b []byte) string {
	if string(b) == prev {
		return prev
	}
	return string(b)
}

// Shared buffers double from sharedMin to sharedMax; a value larger than
// ownAbove gets an allocation of its own. A buffer's unused tail is at
// most one value that did not fit, so what a page holds stays within
// ownAbove/sharedMax (6%) of what its byte cap counts, and a trickle's
// page of one small event does not hold 64 KB.
const (
	sharedMin = 1 << 10
	sharedMax = 64 << 10
	ownAbove  = 4 << 10
)

// copyBytes copies b (nil for SQL NULL) into the page's buffers, capped
// so that an append to one event's bytes cannot reach the next's.
func (d *rowDecoder) copyBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	if len(b) > ownAbove {
		return append(make([]byte, 0, len(b)), b...) // exact, where bytes.Clone rounds cap up
	}
	if len(b) > cap(d.buf)-len(d.buf) {
		// A new buffer; the old one stays alive through the events that
		// point into it.
		d.buf = make([]byte, 0, min(sharedMax, max(2*cap(d.buf), sharedMin, len(b))))
	}
	start := len(d.buf)
	d.buf = append(d.buf, b...)
	return d.buf[start:len(d.buf):len(d.buf)]
}

// pgEpoch is PostgreSQL's timestamp zero, 2000-01-01 00:00:00 UTC, in
// Unix microseconds.
const pgEpoch = 946684800 * 1_000_000

// pgTime decodes a binary timestamptz as pgx does (local time zone), and
// reports false for ±infinity, which a time.Time cannot hold.
func pgTime(b []byte) (time.Time, bool) {
	us := int64(binary.BigEndian.Uint64(b))
	if us == math.MaxInt64 || us == math.MinInt64 {
		return time.Time{}, false
	}
	// Seconds and microseconds apart, as pgx does: us + pgEpoch overflows
	// for the last 300 years PostgreSQL's timestamps reach (294276 AD).
	return time.Unix(pgEpoch/1_000_000+us/1_000_000, (us%1_000_000)*1000), true
}
