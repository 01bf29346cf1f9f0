package indexer

import (
	"encoding/json"
	"errors"

	"github.com/outboxd/outboxd/outbox"
)

// ReadFilter is the filter of the search names N and N-read: tombstones
// are documents too, and searchers must never see them.
const ReadFilter = `{"bool":{"must_not":{"term":{"` + TombstoneField + `":true}}}}`

// writeSuffix names the write alias: the only name outboxd writes through.
const writeSuffix = "-write"

// FirstIndex, WriteAlias and ReadAlias name what Bootstrap creates for an
// index name N. N itself is a filtered alias, the clean view applications
// search; N-read is the same view under the name older releases used.
func FirstIndex(name string) string { return name + "-000001" }
func WriteAlias(name string) string { return name + writeSuffix }
func ReadAlias(name string) string  { return name + "-read" }

// checkName applies the rules every event's index_name passed at append
// (outbox.ValidateIndexName): Elasticsearch's, outboxd's reserved suffixes
// and room for the derived names. It runs again here for events appended
// before those rules existed.
func checkName(name string) error {
	var ve *outbox.ValidationError
	if err := outbox.ValidateIndexName(name); errors.As(err, &ve) {
		return &NameError{name, ve.Reason}
	}
	return nil
}

// aliasesJSON is the "aliases" object of a new concrete index for name.
func aliasesJSON(name string) string {
	n, _ := json.Marshal(name)
	w, _ := json.Marshal(WriteAlias(name))
	rd, _ := json.Marshal(ReadAlias(name))
	return string(w) + `:{"is_write_index":true},` + string(n) + `:{"filter":` + ReadFilter + `},` + string(rd) + `:{"filter":` + ReadFilter + `}`
}

// CheckName is checkName for the operator tools (packages repair,
// rebuild, backfill, reconcile): a backfill refuses an index name before it reads a row.
func CheckName(name string) error { return checkName(name) }
