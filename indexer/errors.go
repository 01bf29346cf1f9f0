package indexer

import (
	"errors"
	"fmt"
)

// IncompatibleError says an existing index or alias cannot be used the way
// outboxd needs it (N a write alias, N-read a filtered read alias).
// Bootstrap never deletes or rewrites anything to fix it: the operator
// decides, typically by reindexing into N-000001 and pointing aliases at it.
type IncompatibleError struct {
	Index  string
	Reason string
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("indexer: index %q is incompatible: %s (nothing was changed)", e.Index, e.Reason)
}

// IsIncompatible reports whether err comes from an existing index or alias
// that outboxd refuses to take over.
func IsIncompatible(err error) bool {
	var e *IncompatibleError
	return errors.As(err, &e)
}

// LayoutLostError says name's aliases are gone while a concrete index of
// it that a rebuild made is still there: creating a new first index would
// hide its documents. No event is at fault; the sink pauses with this
// reason until an operator puts the aliases back.
type LayoutLostError struct {
	Index  string
	Reason string
}

func (e *LayoutLostError) Error() string {
	return fmt.Sprintf("indexer: index %q lost its aliases: %s (nothing was changed)", e.Index, e.Reason)
}

// ResponseError is an error answer of Elasticsearch to a whole request.
type ResponseError struct {
	Op     string // what outboxd was doing, e.g. "create index"
	Status int
	Type   string // Elasticsearch's error.type, e.g. resource_already_exists_exception
	Reason string // Elasticsearch's error.reason
}

func (e *ResponseError) Error() string {
	if e.Type == "" {
		return fmt.Sprintf("indexer: %s: HTTP %d: %s", e.Op, e.Status, e.Reason)
	}
	return fmt.Sprintf("indexer: %s: HTTP %d: %s: %s", e.Op, e.Status, e.Type, e.Reason)
}

// UnavailableError is returned by Sink.Write when no bulk request of the
// batch reached Elasticsearch (connection refused, every node down, ...).
// Nothing was applied, so the relay retries the whole batch without
// counting attempts against any event.
type UnavailableError struct {
	Err error
}

func (e *UnavailableError) Error() string {
	return "indexer: Elasticsearch unavailable: " + e.Err.Error()
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// IsUnavailable reports whether err means Elasticsearch could not be reached.
func IsUnavailable(err error) bool {
	var e *UnavailableError
	return errors.As(err, &e)
}

// NameError says an index name cannot be used: Elasticsearch would refuse
// it, or the derived names (N-000001, N-read) would.
type NameError struct {
	Name   string
	Reason string
}

func (e *NameError) Error() string {
	return fmt.Sprintf("indexer: index_name %q: %s", e.Name, e.Reason)
}

// ConfigError is returned by Sink.Write when Elasticsearch refuses even a
// tiny request of the sink's own making: bad credentials, a proxy that
// blocks the path, a query parameter the server does not know, an index
// spec it will not create, a server version outboxd does not support. No
// event is at fault, so none is rejected; the relay keeps retrying the
// batch (paused, with this reason) until the configuration is fixed.
type ConfigError struct {
	Err error
}

func (e *ConfigError) Error() string {
	return "indexer: Elasticsearch refuses the sink's requests (a configuration problem, not the events'): " + e.Err.Error()
}

func (e *ConfigError) Unwrap() error { return e.Err }

// IsConfig reports whether err is a *ConfigError.
func IsConfig(err error) bool {
	var e *ConfigError
	return errors.As(err, &e)
}
