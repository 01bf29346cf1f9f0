package rebuild

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/scan"
)

// plan loads the rebuilds table's row of the name and decides what this
// run does: continue an unfinished rebuild (a swap noticed only now counts
// as done), refuse one whose aliases or options moved on, or, after a
// finished one (whose kept old index is dropped once its keep time has
// passed), begin the next. otherOptions: the unfinished rebuild that is
// finished first was started with other mappings, settings or source than
// these.
func (r *runner) plan(ctx context.Context, rep *Report) (otherOptions bool, err error) {
	o, st := &r.o, r.st
	cur, err := st.load(ctx)
	if err != nil {
		return false, err
	}
	behind, err := writeIndexOf(ctx, o.ES, o.Index)
	if err != nil {
		return false, err
	}
	hash := o.hash()
	if cur != nil {
		switch cur.Phase {
		case PhaseCopying, PhaseCatchingUp:
			if behind == cur.New {
				// Swapped, but killed before the phase was stored.
				otherOptions = cur.Hash != hash
				cur.Phase = PhaseSwapped
				if err := st.setPhase(ctx, PhaseSwapped); err != nil {
					return false, err
				}
			} else if behind != cur.Old {
				return false, fmt.Errorf("indexer: rebuild %s: %s now points at %s, not at %s where the unfinished rebuild started; abort it", o.Index, indexer.WriteAlias(o.Index), behind, cur.Old)
			} else if cur.Hash != hash {
				return false, fmt.Errorf("indexer: rebuild %s: an unfinished rebuild into %s has other mappings, settings or source; run it with the same options to continue, or abort it", o.Index, cur.New)
			}
			rep.Resumed = cur.Phase
		case PhaseSwapped:
			otherOptions = cur.Hash != hash
			rep.Resumed = cur.Phase
		default:
			dropped, err := dropKeptOld(ctx, o.ES, st, cur, false)
			if err != nil {
				return false, err
			}
			rep.DroppedOld = dropped
			cur = nil
		}
	}
	if o.From == "index" && (cur == nil || cur.Phase == PhaseCopying) {
		from := behind
		if cur != nil {
			from = cur.Old
		}
		if err := checkSourceKept(ctx, o.ES, o.Index, from); err != nil {
			return false, err
		}
	}
	if cur == nil {
		if cur, err = r.begin(ctx, behind, hash); err != nil {
			return false, err
		}
	}
	r.cur = cur
	rep.OldIndex, rep.NewIndex = cur.Old, cur.New
	if rep.Resumed != "" {
		o.Logger.Info("rebuild resumed", "index", o.Index, "new_index", cur.New, "phase", rep.Resumed)
	}
	return otherOptions, nil
}

// begin records the checkpoints of old and creates the next index.
func (r *runner) begin(ctx context.Context, old, hash string) (*record, error) {
	next, err := nextIndex(r.o.Index, old)
	if err != nil {
		return nil, err
	}
	exists, err := indexExists(ctx, r.o.ES, next)
	if err != nil {
		return nil, err
	}
	if exists {
		return nil, fmt.Errorf("indexer: rebuild %s: %s already exists and no rebuild of this name is building it; delete it or rename it first", r.o.Index, next)
	}
	cps, err := shardCheckpoints(ctx, r.o.ES, old)
	if err != nil {
		return nil, err
	}
	row := &record{Old: old, New: next, Phase: PhaseCopying, Hash: hash, Checkpoints: cps}
	if err := r.st.begin(ctx, row); err != nil {
		return nil, err
	}
	return row, nil
}

// nextIndex names the index after old: N-000002 after N-000001.
func nextIndex(name, old string) (string, error) {
	n := 1
	if suffix, ok := strings.CutPrefix(old, name+"-"); ok && len(suffix) == 6 {
		v, err := strconv.Atoi(suffix)
		if err != nil {
			return "", fmt.Errorf("indexer: rebuild %s: cannot number the index after %s", name, old)
		}
		n = v
	}
	if n >= 999999 {
		return "", fmt.Errorf("indexer: rebuild %s: no index number left after %s", name, old)
	}
	return fmt.Sprintf("%s-%06d", name, n+1), nil
}

// checkSourceKept refuses a copy from index when its _source does not
// hold every field: the copy would silently lose what it leaves out.
func checkSourceKept(ctx context.Context, es *elasticsearch.Client, name, index string) error {
	var got map[string]struct {
		Mappings struct {
			Source struct {
				Enabled  *bool    `json:"enabled"`
				Includes []string `json:"includes"`
				Excludes []string `json:"excludes"`
			} `json:"_source"`
		} `json:"mappings"`
	}
	if err := scan.Do(ctx, es, "get mapping of "+index, esapi.IndicesGetMappingRequest{Index: []string{index}}, &got); err != nil {
		return err
	}
	src := got[index].Mappings.Source
	why := ""
	switch {
	case src.Enabled != nil && !*src.Enabled:
		why = "_source is disabled"
	case len(src.Excludes) > 0:
		why = "_source.excludes leaves out " + strings.Join(src.Excludes, ", ")
	case len(src.Includes) > 0:
		why = "_source.includes keeps only " + strings.Join(src.Includes, ", ")
	}
	if why != "" {
		return fmt.Errorf("indexer: rebuild %s: from: %s cannot be copied from the index: %s, so those fields would be lost; rebuild from the source table instead (--from source --source-sql ...)", name, index, why)
	}
	return nil
}

// newIndexBody is the create body of the new index: the given mappings
// and settings, or the old index's, with the outboxd fields merged in.
func newIndexBody(ctx context.Context, es *elasticsearch.Client, old string, mappings, settings []byte) ([]byte, error) {
	m, err := unwrapSpec("mappings", mappings)
	if err != nil {
		return nil, err
	}
	s, err := unwrapSpec("settings", settings)
	if err != nil {
		return nil, err
	}
	if m == nil {
		var got map[string]struct {
			Mappings json.RawMessage `json:"mappings"`
		}
		if err := scan.Do(ctx, es, "get mapping of "+old, esapi.IndicesGetMappingRequest{Index: []string{old}}, &got); err != nil {
			return nil, err
		}
		m = got[old].Mappings
	}
	// Settings not given are the current index's: the shard count,
	// replicas, analysis and gc_deletes stay unless they are overridden.
	if s, err = mergedSettings(ctx, es, old, s); err != nil {
		return nil, err
	}
	spec, _ := json.Marshal(map[string]json.RawMessage{"mappings": m, "settings": s})
	return indexer.IndexBody(spec)
}

// unwrapSpec accepts the object itself or {"<key>": object}.
func unwrapSpec(key string, b []byte) (json.RawMessage, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, fmt.Errorf("indexer: rebuild: %s: must be a JSON object: %w", key, err)
	}
	if inner, ok := obj[key]; ok && len(obj) == 1 {
		return inner, nil
	}
	return b, nil
}

// mergedSettings are the old index's settings, without those
// Elasticsearch sets itself and refuses at creation, with given laid over
// them key by key (a null in given removes the key: its default applies).
func mergedSettings(ctx context.Context, es *elasticsearch.Client, old string, given json.RawMessage) (json.RawMessage, error) {
	var got map[string]struct {
		Settings map[string]any `json:"settings"`
	}
	if err := scan.Do(ctx, es, "get settings of "+old, esapi.IndicesGetSettingsRequest{Index: []string{old}, FlatSettings: &ptrTrue}, &got); err != nil {
		return nil, err
	}
	flat := got[old].Settings
	for k := range flat {
		if !copyableSetting(k) {
			delete(flat, k)
		}
	}
	if len(given) > 0 {
		var user map[string]any
		if err := json.Unmarshal(given, &user); err != nil || user == nil {
			return nil, fmt.Errorf("indexer: rebuild: settings: must be a JSON object")
		}
		flattenSettings("", user, flat)
	}
	return json.Marshal(flat)
}

// copyableSetting says whether an old index's (flat) setting can be given
// when creating an index.
func copyableSetting(key string) bool {
	for _, k := range []string{"uuid", "version", "creation_date", "provided_name", "history_uuid", "resize", "routing", "blocks", "verified_before_close", "shrink"} {
		if key == "index."+k || strings.HasPrefix(key, "index."+k+".") {
			return false
		}
	}
	return true
}

// flattenSettings writes settings, nested or dotted, as flat keys under
// "index." into out; null removes a key and everything below it.
func flattenSettings(prefix string, settings map[string]any, out map[string]any) {
	for k, v := range settings {
		key := prefix + k
		if prefix == "" && key != "index" && !strings.HasPrefix(key, "index.") {
			key = "index." + key
		}
		switch v := v.(type) {
		case map[string]any:
			flattenSettings(key+".", v, out)
		case nil:
			for have := range out {
				if have == key || strings.HasPrefix(have, key+".") {
					delete(out, have)
				}
			}
		default:
			out[key] = v
		}
	}
}
