package documents

import "errors"

// ErrNotDefined is wrapped when an index has no document definition.
var ErrNotDefined = errors.New("the index has no document definition")

// ErrEventFed is wrapped by Define's *DefinitionError for an index that has
// upsert or delete events in the outbox.
var ErrEventFed = errors.New("the index is event-fed")

// DefinitionError says why a definition (or a watch) was refused: Reason
// names the field or check and what is wrong.
type DefinitionError struct {
	Index  string
	Reason string
	Err    error // the cause, when there is one (ErrEventFed, a PostgreSQL error)
}

func (e *DefinitionError) Error() string {
	return "documents: index " + e.Index + ": " + e.Reason
}

func (e *DefinitionError) Unwrap() error { return e.Err }
