package indexer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
)

// ErrNoIndex is returned by MigrateLayout for a name with nothing behind it.
var ErrNoIndex = errors.New("indexer: no index or alias of that name")

// MigrateLayout upgrades the existing index name to the current layout
// (see Bootstrap) and reports whether it changed anything. Unlike
// Bootstrap it never creates an index.
func MigrateLayout(ctx context.Context, es *elasticsearch.Client, name string) (changed bool, err error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	write, first := WriteAlias(name), FirstIndex(name)
	raw, err := perform(ctx, es, "resolve index", esapi.IndicesResolveIndexRequest{
		Name:              []string{name, write, first},
		ExpandWildcards:   "all",
		IgnoreUnavailable: &ptrTrue,
	})
	if err != nil {
		return false, err
	}
	var r resolved
	if err := json.Unmarshal(raw, &r); err != nil {
		return false, fmt.Errorf("indexer: resolve index: %w", err)
	}
	if r.alias(name) == nil && r.alias(write) == nil && !r.index(first) && !r.index(name) {
		return false, fmt.Errorf("%w: %q", ErrNoIndex, name)
	}
	body, err := indexBody(nil)
	if err != nil {
		return false, err
	}
	for range 5 {
		var created bool
		done, err := bootstrapStep(ctx, es, name, body, &created, nil)
		if err != nil || done {
			return changed, err
		}
		changed = true
	}
	return changed, fmt.Errorf("indexer: migrate %q: the indices kept changing; try again", name)
}

// LayoutExists reports whether anything of name's layout is there (N,
// N-write or N-000001): a tool that would otherwise create the index with
// a spec it was not given can refuse instead.
func LayoutExists(ctx context.Context, es *elasticsearch.Client, name string) (bool, error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	write, first := WriteAlias(name), FirstIndex(name)
	raw, err := perform(ctx, es, "resolve index", esapi.IndicesResolveIndexRequest{
		Name:              []string{name, write, first},
		ExpandWildcards:   "all",
		IgnoreUnavailable: &ptrTrue,
	})
	if err != nil {
		return false, err
	}
	var r resolved
	if err := json.Unmarshal(raw, &r); err != nil {
		return false, fmt.Errorf("indexer: resolve index: %w", err)
	}
	return r.alias(name) != nil || r.alias(write) != nil || r.index(first) || r.index(name), nil
}
