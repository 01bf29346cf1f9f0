package rebuild

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/indexer"
)

// swap moves the three names in one atomic request. The remove of N-write
// must find it on the old index, so a layout changed by someone else fails
// the whole request instead of being overwritten.
func (r *runner) swap(ctx context.Context) error {
	if _, err := indexer.Perform(ctx, r.o.ES, "refresh "+r.cur.New, esapi.IndicesRefreshRequest{Index: []string{r.cur.New}}); err != nil {
		return err
	}
	oldJ, _ := json.Marshal(r.cur.Old)
	newJ, _ := json.Marshal(r.cur.New)
	name := r.o.Index
	var actions []string
	for _, a := range []string{indexer.WriteAlias(name), name, indexer.ReadAlias(name)} {
		aj, _ := json.Marshal(a)
		must := a == indexer.WriteAlias(name)
		actions = append(actions, fmt.Sprintf(`{"remove":{"index":%s,"alias":%s,"must_exist":%t}}`, oldJ, aj, must))
	}
	for _, a := range [][2]string{{indexer.WriteAlias(name), `"is_write_index":true`}, {name, `"filter":` + indexer.ReadFilter}, {indexer.ReadAlias(name), `"filter":` + indexer.ReadFilter}} {
		aj, _ := json.Marshal(a[0])
		actions = append(actions, `{"add":{"index":`+string(newJ)+`,"alias":`+string(aj)+`,`+a[1]+`}}`)
	}
	body := `{"actions":[` + strings.Join(actions, ",") + `]}`
	if err := r.st.check(ctx); err != nil {
		return err
	}
	if _, err := indexer.Perform(ctx, r.o.ES, "swap aliases of "+name, esapi.IndicesUpdateAliasesRequest{Body: strings.NewReader(body)}); err != nil {
		return err
	}
	r.cur.Phase = PhaseSwapped
	if err := r.st.setPhase(ctx, PhaseSwapped); err != nil {
		return err
	}
	r.o.Logger.Info("rebuild swapped", "index", name, "old_index", r.cur.Old, "new_index", r.cur.New)
	return nil
}
