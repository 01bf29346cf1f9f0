package indexer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/outboxd/outboxd/outbox"
)

// The bulk body is built by appending to pooled byte slices: no
// encoding/json on the hot path, no per-event allocation beyond what
// append amortizes.
var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

func getBody() *[]byte { return bodyPool.Get().(*[]byte) }

func putBody(b *[]byte) {
	if cap(*b) > 16<<20 { // let the GC have the rare giant
		return
	}
	*b = (*b)[:0]
	bodyPool.Put(b)
}

// appendAction appends one bulk "index" action line addressed to the write
// alias of index; the caller appends the source line.
func appendAction(b []byte, index, id string, version int64, vt versionType) []byte {
	b = append(b, `{"index":{"_index":`...)
	// index's write alias (WriteAlias), without building the string
	b = appendString(b, index)
	b = append(append(b[:len(b)-1], writeSuffix...), '"')
	b = append(b, `,"_id":`...)
	b = appendString(b, id)
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, version, 10)
	if vt == externalGTE {
		b = append(b, `,"version_type":"external_gte"}}`...)
	} else {
		b = append(b, `,"version_type":"external"}}`...)
	}
	return append(b, '\n')
}

// appendTombstone appends the source of a tombstone document.
func appendTombstone(b []byte, deletedAt string) []byte {
	b = append(b, `{"`+TombstoneField+`":true,"`+TombstoneAtField+`":"`...)
	b = append(b, deletedAt...)
	return append(b, `"}`...)
}

// appendString appends s as a JSON string. Ids and index names are nearly
// always plain ASCII, which is copied as is.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// checkDocument returns why doc cannot be sent as a bulk source line, or
// "". A source must be one JSON object on one line: a newline inside it
// would split the bulk framing and fail the whole request. validJSON
// skips parsing a document known to be valid JSON.
func checkDocument(doc []byte, validJSON bool) string {
	i := 0
	for i < len(doc) && (doc[i] == ' ' || doc[i] == '\t' || doc[i] == '\n' || doc[i] == '\r') {
		i++
	}
	if i == len(doc) || doc[i] != '{' {
		return "document: must be a JSON object"
	}
	if !validJSON && !json.Valid(doc) {
		return "document: invalid JSON"
	}
	// Written before the outbox refused them (or around it): the index
	// would hide such a document and purge it as a tombstone.
	if f := outbox.ReservedField(doc); f != "" {
		return fmt.Sprintf("document: the top-level field %s is reserved (it marks a delete's tombstone in the index)", f)
	}
	return ""
}

// oneLine returns doc without newlines, compacting it only when needed.
func oneLine(doc []byte) []byte {
	if bytes.IndexByte(doc, '\n') < 0 && bytes.IndexByte(doc, '\r') < 0 {
		return doc
	}
	var out bytes.Buffer
	_ = json.Compact(&out, doc) // checkDocument validated it
	return out.Bytes()
}

// bulkResponse is the part of a _bulk answer kept by bulkFilterPath.
type bulkResponse struct {
	Errors bool `json:"errors"`
	Items  []struct {
		Index BulkItem `json:"index"`
	} `json:"items"`
}

// BulkItem is one item of a _bulk answer, for the sink and for the
// operator tools (package repair) alike.
type BulkItem struct {
	Status      int      `json:"status"`
	Version     int64    `json:"_version"`
	SeqNo       int64    `json:"_seq_no"`
	PrimaryTerm int64    `json:"_primary_term"`
	Error       *ESError `json:"error"`
}

// Reason is the item's error as "type: reason", or its status when the
// answer carries no error.
func (it *BulkItem) Reason() string {
	if it.Error == nil {
		return fmt.Sprintf("status %d", it.Status)
	}
	return it.Error.Type + ": " + it.Error.Reason
}

// ESError is Elasticsearch's error object.
type ESError struct {
	Type     string   `json:"type"`
	Reason   string   `json:"reason"`
	CausedBy *ESError `json:"caused_by"`
}

func (e *ESError) String() string {
	if e == nil {
		return ""
	}
	s := e.Type + ": " + e.Reason
	if e.CausedBy != nil && e.CausedBy.Reason != "" {
		s += " (caused by " + e.CausedBy.Type + ": " + e.CausedBy.Reason + ")"
	}
	return s
}

// bulkFilterPath keeps only what classification needs; a fully successful
// bulk answer shrinks to {"errors":false,"items":[{"index":{"status":201}},...]}.
var bulkFilterPath = []string{"errors", "items.*.status", "items.*.error.type", "items.*.error.reason", "items.*.error.caused_by.type", "items.*.error.caused_by.reason"}

// allSucceeded recognizes the answer of a bulk without item errors without
// decoding it; Elasticsearch writes "errors" before "items".
func allSucceeded(body []byte) bool {
	return bytes.HasPrefix(body, []byte(`{"errors":false`))
}

// itemClass is what one bulk item's answer means.
type itemClass uint8

const (
	classApplied itemClass = iota
	classConflict
	classMissingAlias
	classRetry
	classRejected
)

func classify(it *BulkItem) (itemClass, string) {
	switch {
	case it.Status >= 200 && it.Status < 300:
		return classApplied, ""
	case it.Status == 409:
		return classConflict, it.Error.String()
	case it.Status == 404 && it.Error != nil && it.Error.Type == "index_not_found_exception":
		// require_alias: the write alias vanished after bootstrap.
		return classMissingAlias, "write alias missing: " + it.Error.String()
	case it.Status == 429 || it.Status >= 500 || it.Status == 408,
		// A write block on the index behind the write alias: a rebuild
		// has just moved the alias away from it, and a retry resolves the
		// alias again.
		it.Status == 403 && it.Error != nil && it.Error.Type == "cluster_block_exception":
		return classRetry, "HTTP " + strconv.Itoa(it.Status) + ": " + it.Error.String()
	}
	return classRejected, "HTTP " + strconv.Itoa(it.Status) + ": " + it.Error.String()
}

// outcomeOf maps an event's final class to what the relay sees.
func outcomeOf(c itemClass, reason string) outbox.Outcome {
	switch c {
	case classApplied:
		return outbox.Outcome{Status: outbox.Applied}
	case classConflict:
		return outbox.Outcome{Status: outbox.Stale}
	case classRejected:
		return outbox.Outcome{Status: outbox.Rejected, Reason: reason}
	case classMissingAlias:
		// The index's fault, not the event's: wait, charging no attempt.
		return outbox.Outcome{Status: outbox.Retry, Reason: reason, Outage: true}
	}
	return outbox.Outcome{Status: outbox.Retry, Reason: reason}
}
