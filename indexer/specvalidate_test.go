package indexer

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestValidateIndexSpec: what outboxd check and the relay refuse of an
// index spec before any server is reached, and how they tell the server's
// refusal of a spec (IndexSpecError) from a server that does not answer.
func TestValidateIndexSpec(t *testing.T) {
	t.Parallel()
	for spec, want := range map[string]string{
		`{"mappings":{"properties":{"title":{"type":"text"}}}}`: "",
		``:                "",
		`{"mappings":`:    "must be a JSON object",
		`{"aliases":{}}`:  "aliases: outboxd owns the aliases",
		`{"template":{}}`: "template: unknown key",
		`{"mappings":{"properties":{"` + TombstoneField + `":{"type":"text"}}}}`: "outboxd needs type",
	} {
		err := ValidateIndexSpec([]byte(spec))
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%q: %v, want %q", spec, err, want)
		}
	}
	es, _ := setup(t)
	err := CheckIndexSpec(context.Background(), es, []byte(`{"mappings":{"properties":{"title":{"type":"txet"}}}}`))
	var se *IndexSpecError
	var re *ResponseError
	if !errors.As(err, &se) || !strings.Contains(se.Reason, "[txet] declared on field [title]") || !errors.As(err, &re) || re.Status != 400 {
		t.Fatalf("a spec the server refuses: %v (%T), want an *IndexSpecError with the reason over an HTTP 400", err, err)
	}
}
