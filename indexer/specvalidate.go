package indexer

// IndexSpecError is CheckIndexSpec's answer when the server refuses the
// spec itself (HTTP 400): a configuration problem, which asking again
// does not fix, as opposed to a server that does not answer.
type IndexSpecError struct {
	Reason   string // the innermost reason, e.g. "mapper_parsing_exception: The mapper type [txet] ..."
	Response *ResponseError
}

func (e *IndexSpecError) Error() string {
	return "indexer: index spec: Elasticsearch refuses it: " + e.Reason
}

func (e *IndexSpecError) Unwrap() error { return e.Response }

// ValidateIndexSpec reports, without asking any server, why spec cannot be
// an index spec: not a JSON object of "settings" and/or "mappings", an
// "aliases" key (outboxd owns the aliases), mappings that are not an
// object or that redefine outboxd's own fields. What it accepts may still
// be refused by the server; CheckIndexSpec asks it. outboxd check and
// outboxd relay run both at start, this one before any server is reached.
func ValidateIndexSpec(spec []byte) error {
	_, err := indexBody(spec)
	return err
}
