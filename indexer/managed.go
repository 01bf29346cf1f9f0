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
// those whose concrete index carries the alias N beside N-write (or beside
// N-read, the layout of older releases). An unrelated alias that merely
// ends in -write or -read is not one.
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
			// N-write beside N, or N beside N-read (older releases)
			n, ok := strings.CutSuffix(a, writeSuffix)
			if !ok {
				n, ok = strings.CutSuffix(a, "-read")
			}
			if _, base := idx.Aliases[n]; ok && base {
				seen[n] = true
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
