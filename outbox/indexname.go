package outbox

import (
	"fmt"
	"strings"
)

// reservedSuffixes end the names outboxd derives from an index name N: the
// read alias N-read, the write alias N-write (reserved ahead of a layout
// that adds it) and the concrete indexes N-000001, ... ('#' is any digit;
// Elasticsearch refuses '#' in names, so it cannot stand for itself). An
// event whose index_name ends like this would be written through another
// index's alias, into that index's documents.
//
// The SQL copy is the function reserved_suffix in
// schema/migrations/0004_index_names.sql, used by the events table's
// check trigger (0042, which append goes through); TestIndexNameRulesAgree
// checks that Go and SQL accept and refuse the same names.
var reservedSuffixes = []string{"-read", "-write", "-######"}

// MaxIndexNameBytes is the longest index name outboxd accepts:
// Elasticsearch allows 255 bytes, and the concrete index N-000001 is 7
// bytes longer than N.
const MaxIndexNameBytes = 255 - len("-000001")

// ReservedSuffix returns the suffix of name that outboxd reserves for its
// own derived names, or "" if there is none.
func ReservedSuffix(name string) string {
	for _, s := range reservedSuffixes {
		if len(name) < len(s) {
			continue
		}
		tail := name[len(name)-len(s):]
		if suffixMatches(tail, s) {
			return tail
		}
	}
	return ""
}

func suffixMatches(tail, pattern string) bool {
	for i := range len(pattern) {
		if pattern[i] == '#' {
			if tail[i] < '0' || tail[i] > '9' {
				return false
			}
		} else if tail[i] != pattern[i] {
			return false
		}
	}
	return true
}

// ValidateIndexName reports why name cannot be an event's index_name, as a
// *ValidationError for the field index_name, or nil. The rules are
// Elasticsearch's (its lowercase check is Unicode-aware, so "Ünicode" is
// refused too), plus outboxd's reserved suffixes and the room its
// concrete index name needs.
func ValidateIndexName(name string) error {
	reason := ""
	switch {
	case name == "":
		reason = "must not be empty"
	case len(name) > MaxIndexNameBytes:
		reason = fmt.Sprintf("%d bytes, at most %d (Elasticsearch allows 255 and outboxd's concrete index appends -000001)", len(name), MaxIndexNameBytes)
	case strings.ContainsAny(name[:1], "_-+."):
		// Elasticsearch refuses _ - +; names starting with a dot are
		// reserved for hidden and system indices.
		reason = `"` + name + `" must not start with _ - + or .`
	case strings.ContainsAny(name, `\/*?"<>|,#: `):
		reason = `"` + name + `" must not contain \ / * ? " < > | , # : or a space`
	case strings.ToLower(name) != name:
		reason = `"` + name + `" must be lowercase`
	default:
		if s := ReservedSuffix(name); s != "" {
			reason = fmt.Sprintf(`"%s" ends in %s, which outboxd reserves for the aliases and concrete indexes of index "%s"`, name, s, name[:len(name)-len(s)])
		}
	}
	if reason == "" {
		return nil
	}
	return &ValidationError{"index_name", reason}
}
