package scan

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/indexer"
)

// Resolve returns the concrete indices behind name and the write
// index. A concrete index is its own write index.
func Resolve(ctx context.Context, es *elasticsearch.Client, name string) ([]string, string, error) {
	// N is a filtered alias; the operator means the index behind it, which
	// N-write shows whole.
	if !strings.HasSuffix(name, indexer.WriteAlias("")) {
		target, err := indexer.WriteTarget(ctx, es, name)
		if err != nil {
			return nil, "", err
		}
		name = target
	}
	var aliases map[string]struct {
		Aliases map[string]struct {
			IsWriteIndex *bool          `json:"is_write_index"`
			Filter       map[string]any `json:"filter"`
		} `json:"aliases"`
	}
	err := Do(ctx, es, fmt.Sprintf("index %q: get alias", name), esapi.IndicesGetAliasRequest{Name: []string{name}}, &aliases)
	if err != nil && !IsStatus(err, 404) {
		return nil, "", err
	}
	if err == nil && len(aliases) > 0 {
		var indices []string
		write := ""
		for idx, a := range aliases {
			al := a.Aliases[name]
			if len(al.Filter) > 0 {
				return nil, "", fmt.Errorf("indexer: index: %q is a filtered alias (a read alias hides tombstones); pass the write alias or a concrete index", name)
			}
			indices = append(indices, idx)
			if al.IsWriteIndex != nil && *al.IsWriteIndex {
				write = idx
			}
		}
		sort.Strings(indices)
		if write == "" && len(indices) == 1 {
			write = indices[0]
		}
		if write == "" {
			return nil, "", fmt.Errorf("indexer: index: alias %q points at %d indices and none is the write index", name, len(indices))
		}
		return indices, write, nil
	}
	err = Do(ctx, es, fmt.Sprintf("index %q", name), esapi.IndicesExistsRequest{Index: []string{name}}, nil)
	if IsStatus(err, 404) {
		return nil, "", fmt.Errorf("indexer: index: %q is neither an alias nor an index", name)
	}
	if err != nil {
		return nil, "", err
	}
	return []string{name}, name, nil
}
