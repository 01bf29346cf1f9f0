package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// MessagePrefix starts the reserved index names that carry messages:
// a message for destination D is an event on index MessagePrefix+D. The
// leading dot keeps them apart from application indexes, and streams that
// feed Elasticsearch exclude MessagePrefix+"*".
const MessagePrefix = ".outboxd-message."

// Message is a notification for a named destination (a webhook), appended
// in the business transaction and sent by the relay at most once per
// (Destination, DedupeKey): later messages with the same key are recorded
// as duplicates in the delivery ledger and never sent.
type Message struct {
	Destination string
	DedupeKey   string
	Payload     json.RawMessage // a JSON object
}

var destinationRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidateDestination reports why name cannot name a destination, or nil.
func ValidateDestination(name string) error {
	if !destinationRE.MatchString(name) {
		return &ValidationError{"destination", fmt.Sprintf("%q is not a valid destination name (1 to 63 of a-z 0-9 _ -, starting with a letter or digit)", name)}
	}
	return nil
}

// ValidateMessage checks m against the same rules as the SQL append_message.
func ValidateMessage(m *Message) error {
	if err := ValidateDestination(m.Destination); err != nil {
		return err
	}
	switch {
	case m.DedupeKey == "":
		return &ValidationError{"dedupe_key", "must not be empty"}
	case len(m.DedupeKey) > 512:
		return &ValidationError{"dedupe_key", fmt.Sprintf("%d bytes, at most 512", len(m.DedupeKey))}
	case !printableASCII(m.DedupeKey):
		return &ValidationError{"dedupe_key", fmt.Sprintf("%q holds a control character or a non-ASCII character: only printable ASCII travels unchanged in the webhook-id header", m.DedupeKey)}
	case strings.Trim(m.DedupeKey, " ") != m.DedupeKey:
		return &ValidationError{"dedupe_key", fmt.Sprintf("%q starts or ends with a blank, which receivers trim from the webhook-id header (its signature would never verify)", m.DedupeKey)}
	case !isObject(m.Payload):
		return &ValidationError{"payload", "must be a JSON object"}
	}
	return nil
}

// printableASCII reports whether s is only bytes 0x20 to 0x7e: what an
// HTTP header carries unchanged through every stack.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// MessageIndex is the reserved index name of destination's messages.
func MessageIndex(destination string) string { return MessagePrefix + destination }

// MessageDestination returns the destination of an event that carries a
// message, and false for any other event.
func MessageDestination(indexName string) (string, bool) {
	return strings.CutPrefix(indexName, MessagePrefix)
}

// AppendMessage writes one message inside db (normally the caller's
// transaction) and returns its event id. An invalid message returns a
// *ValidationError and aborts the transaction, like Append.
func (o *Outbox) AppendMessage(ctx context.Context, db DB, m Message) (int64, error) {
	if err := ValidateMessage(&m); err != nil {
		return 0, o.refuse(ctx, db, err)
	}
	var id int64
	err := db.QueryRow(ctx, `SELECT `+o.ident+`.append_message($1, $2, $3)`, m.Destination, m.DedupeKey, []byte(m.Payload)).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("outboxd: append message: %w", err)
	}
	return id, nil
}
