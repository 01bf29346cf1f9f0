package outbox

import (
	"encoding/json"
	"time"
)

// Op is what an event does to its document.
type Op string

const (
	OpUpsert Op = "upsert"
	OpDelete Op = "delete"
	// OpRefresh says only that a document of a definition-fed index may
	// have changed: it carries no document, and the relay reads the
	// document from the index's definition (package documents). Append
	// refuses it; Outbox.Refresh writes it.
	OpRefresh Op = "refresh"
)

// Event is one outbox row. Append fills the caller's part; the relay fills
// ID, XID and CreatedAt when it reads the event back.
type Event struct {
	ID         int64
	XID        uint64 // writing transaction; the relay's reading order
	IndexName  string
	SourceID   string
	Version    int64 // 0 on Append means "assign the next version"
	Op         Op
	Document   json.RawMessage // JSON object for upserts; nil for deletes
	EventType  string
	Headers    json.RawMessage
	OccurredAt time.Time
	CreatedAt  time.Time
}

// Size approximates the memory an event holds, for the relay's byte caps.
func (e *Event) Size() int {
	return 96 + len(e.IndexName) + len(e.SourceID) + len(e.Document) + len(e.EventType) + len(e.Headers)
}
