package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
)

// CheckIndexSpec has Elasticsearch validate spec's settings and mappings
// (with the outboxd fields merged in) by simulating an index template made
// of them; nothing is created. A spec the server refuses would otherwise
// only surface when the first event of a new index name arrives.
func CheckIndexSpec(ctx context.Context, es *elasticsearch.Client, spec []byte) error {
	body, err := indexBody(spec)
	if err != nil {
		return err
	}
	tmpl := append([]byte(`{"index_patterns":["outboxd-index-spec-check"],"template":`), body...)
	tmpl = append(tmpl, '}')
	raw, err := perform(ctx, es, "check index spec", esapi.IndicesSimulateTemplateRequest{Body: bytes.NewReader(tmpl), FilterPath: []string{"template.settings.index.number_of_shards"}})
	var re *ResponseError
	if errors.As(err, &re) && re.Status == 400 {
		return &IndexSpecError{Reason: innermost(raw, re), Response: re}
	}
	return err
}

// innermost digs the innermost reason out of an error answer: for an
// invalid mapping Elasticsearch wraps the useful one ("The mapper type [x]
// declared on field [a] does not exist") in several generic ones.
func innermost(body []byte, re *ResponseError) string {
	var r struct {
		Error *ESError `json:"error"`
	}
	if json.Unmarshal(body, &r) != nil || r.Error == nil {
		return re.Type + ": " + re.Reason
	}
	e := r.Error
	for e.CausedBy != nil && e.CausedBy.Reason != "" {
		e = e.CausedBy
	}
	return e.Type + ": " + e.Reason
}
