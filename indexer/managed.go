package indexer

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/elastic/go-elasticsearch/v8"
)

// ManagedIndexes lists the index names outboxd manages on this cluster:
// those whose concrete index carries both the write alias N and the read
// alias N-read. An unrelated alias that merely ends in -read is not one.
func ManagedIndexes(ctx context.Context, es *elasticsearch.Client) ([]string, error) {
	res, err := es.Indices.GetAlias(es.Indices.GetAlias.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("indexer: list managed indexes: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if res.IsError() {
		return nil, fmt.Errorf("indexer: list managed indexes: %s", res.String())
	}
	var body map[string]struct {
		Aliases map[string]json.RawMessage `json:"aliases"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("indexer: list managed indexes: %w", err)
	}
	seen := map[string]bool{}
	for _, idx := range body {
		for a := range idx.Aliases {
			if n, ok := strings.CutSuffix(a, "-read"); ok {
				if _, write := idx.Aliases[n]; write {
					seen[n] = true
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}
