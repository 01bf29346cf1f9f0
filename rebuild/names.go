package rebuild

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/scan"
)

// deleteUnaliased deletes index unless one of name's aliases (N, N-write,
// N-read) points at it, checked right before the delete: every delete of
// an outboxd tool goes through here, so none removes live data.
func deleteUnaliased(ctx context.Context, es *elasticsearch.Client, name, index string) error {
	alias, err := aliasOn(ctx, es, name, index)
	if err != nil {
		return err
	}
	if alias != "" {
		return fmt.Errorf("indexer: rebuild %s: refusing to delete %s: %s points at it (outboxd never deletes an index %s, %s or %s points at)",
			name, index, alias, name, indexer.WriteAlias(name), indexer.ReadAlias(name))
	}
	if _, err := indexer.Perform(ctx, es, "delete index "+index, esapi.IndicesDeleteRequest{Index: []string{index}}); err != nil && !scan.IsStatus(err, 404) {
		return err
	}
	return nil
}

// aliasOn returns the first of name's aliases that points at index, or "".
func aliasOn(ctx context.Context, es *elasticsearch.Client, name, index string) (string, error) {
	r, err := resolveNames(ctx, es, name, indexer.WriteAlias(name), indexer.ReadAlias(name))
	if err != nil {
		return "", err
	}
	for _, a := range r.Aliases {
		for _, t := range a.Indices {
			if t == index {
				return a.Name, nil
			}
		}
	}
	return "", nil
}

// writeIndexOf returns the concrete index behind name's write alias.
func writeIndexOf(ctx context.Context, es *elasticsearch.Client, name string) (string, error) {
	write := indexer.WriteAlias(name)
	r, err := resolveNames(ctx, es, write)
	if err != nil {
		return "", err
	}
	var t []string
	for _, a := range r.Aliases {
		if a.Name == write {
			t = a.Indices
		}
	}
	if len(t) != 1 {
		return "", fmt.Errorf("indexer: rebuild %s: %s must point at exactly one index (it points at %d); run outboxd migrate-index --index %s first", name, write, len(t), name)
	}
	return t[0], nil
}

// resolved is the answer of _resolve/index.
type resolved struct {
	Indices []struct {
		Name string `json:"name"`
	} `json:"indices"`
	Aliases []struct {
		Name    string   `json:"name"`
		Indices []string `json:"indices"`
	} `json:"aliases"`
}

func resolveNames(ctx context.Context, es *elasticsearch.Client, names ...string) (*resolved, error) {
	raw, err := indexer.Perform(ctx, es, "resolve index", esapi.IndicesResolveIndexRequest{Name: names, ExpandWildcards: "all", IgnoreUnavailable: &ptrTrue})
	if err != nil {
		return nil, err
	}
	var r resolved
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("indexer: resolve index: %w", err)
	}
	return &r, nil
}

func indexExists(ctx context.Context, es *elasticsearch.Client, index string) (bool, error) {
	r, err := resolveNames(ctx, es, index)
	if err != nil {
		return false, err
	}
	for _, i := range r.Indices {
		if i.Name == index {
			return true, nil
		}
	}
	return false, nil
}

var ptrTrue = true
