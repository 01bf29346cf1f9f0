package indexer

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
)

type resolved struct {
	Indices []struct {
		Name    string   `json:"name"`
		Aliases []string `json:"aliases"`
	} `json:"indices"`
	Aliases []struct {
		Name    string   `json:"name"`
		Indices []string `json:"indices"`
	} `json:"aliases"`
	DataStreams []struct {
		Name string `json:"name"`
	} `json:"data_streams"`
}

func (r *resolved) index(n string) bool {
	for _, i := range r.Indices {
		if i.Name == n {
			return true
		}
	}
	return false
}

func (r *resolved) alias(n string) []string {
	for _, a := range r.Aliases {
		if a.Name == n {
			return a.Indices
		}
	}
	return nil
}

func (r *resolved) dataStream(n string) bool {
	for _, d := range r.DataStreams {
		if d.Name == n {
			return true
		}
	}
	return false
}

// writeTarget returns the name through which name's tombstones are seen
// and written: its write alias, or name itself in the layout of older
// releases (before Bootstrap upgraded it) and for names outboxd did not
// create.
func writeTarget(ctx context.Context, es *elasticsearch.Client, name string) (string, error) {
	write := WriteAlias(name)
	raw, err := perform(ctx, es, "resolve index", esapi.IndicesResolveIndexRequest{
		Name:              []string{write},
		ExpandWildcards:   "all",
		IgnoreUnavailable: &ptrTrue,
	})
	if err != nil {
		return "", err
	}
	var r resolved
	if err := json.Unmarshal(raw, &r); err != nil {
		return "", fmt.Errorf("indexer: resolve index: %w", err)
	}
	if r.alias(write) != nil {
		return write, nil
	}
	return name, nil
}

// WriteTarget is writeTarget for the operator tools, which resolve the name an operator gives to the index behind it.
func WriteTarget(ctx context.Context, es *elasticsearch.Client, name string) (string, error) {
	return writeTarget(ctx, es, name)
}
