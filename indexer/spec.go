package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

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

// outboxdFields are merged into every mapping, default or user supplied.
var outboxdFields = map[string]any{
	TombstoneField:   map[string]any{"type": "boolean"},
	TombstoneAtField: map[string]any{"type": "date"},
}

// indexBody returns the settings and mappings for a new concrete index:
// spec's, or single-node friendly defaults (1 shard, 0 replicas; production
// clusters supply their own spec), with the outboxd fields merged in.
func indexBody(spec []byte) ([]byte, error) {
	body := map[string]json.RawMessage{
		"settings": json.RawMessage(`{"index":{"number_of_shards":1,"number_of_replicas":0}}`),
		"mappings": json.RawMessage(`{"dynamic":true}`),
	}
	if len(bytes.TrimSpace(spec)) > 0 {
		var user map[string]json.RawMessage
		if err := json.Unmarshal(spec, &user); err != nil {
			return nil, fmt.Errorf("indexer: index spec: must be a JSON object with \"settings\" and/or \"mappings\": %w", err)
		}
		for k, v := range user {
			switch k {
			case "settings", "mappings":
				body[k] = v
			case "aliases":
				return nil, errors.New("indexer: index spec: aliases: outboxd owns the aliases (N, N-write and N-read); remove this key")
			default:
				return nil, fmt.Errorf("indexer: index spec: %s: unknown key; only \"settings\" and \"mappings\" are allowed", k)
			}
		}
	}
	var mappings map[string]any
	if err := json.Unmarshal(body["mappings"], &mappings); err != nil || mappings == nil {
		return nil, errors.New("indexer: index spec: mappings: must be a JSON object")
	}
	props, _ := mappings["properties"].(map[string]any)
	if props == nil {
		if _, ok := mappings["properties"]; ok {
			return nil, errors.New("indexer: index spec: mappings.properties: must be a JSON object")
		}
		props = make(map[string]any)
	}
	for f, want := range outboxdFields {
		if have, ok := props[f]; ok {
			h, _ := have.(map[string]any)
			if h == nil || h["type"] != want.(map[string]any)["type"] {
				return nil, fmt.Errorf("indexer: index spec: mappings.properties.%s: outboxd needs type %q here", f, want.(map[string]any)["type"])
			}
			continue
		}
		props[f] = want
	}
	mappings["properties"] = props
	m, err := json.Marshal(mappings)
	if err != nil {
		return nil, fmt.Errorf("indexer: index spec: mappings: %w", err)
	}
	body["mappings"] = m
	return json.Marshal(body)
}
