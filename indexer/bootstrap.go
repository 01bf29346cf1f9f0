package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/outbox"
)

// ReadFilter is the filter of the search names N and N-read: tombstones
// are documents too, and searchers must never see them.
const ReadFilter = `{"bool":{"must_not":{"term":{"` + TombstoneField + `":true}}}}`

// outboxdFields are merged into every mapping, default or user supplied.
var outboxdFields = map[string]any{
	TombstoneField:   map[string]any{"type": "boolean"},
	TombstoneAtField: map[string]any{"type": "date"},
}

// writeSuffix names the write alias: the only name outboxd writes through.
const writeSuffix = "-write"

// FirstIndex, WriteAlias and ReadAlias name what Bootstrap creates for an
// index name N. N itself is a filtered alias, the clean view applications
// search; N-read is the same view under the name older releases used.
func FirstIndex(name string) string { return name + "-000001" }
func WriteAlias(name string) string { return name + writeSuffix }
func ReadAlias(name string) string  { return name + "-read" }

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

// checkName applies the rules every event's index_name passed at append
// (outbox.ValidateIndexName): Elasticsearch's, outboxd's reserved suffixes
// and room for the derived names. It runs again here for events appended
// before those rules existed.
func checkName(name string) error {
	var ve *outbox.ValidationError
	if err := outbox.ValidateIndexName(name); errors.As(err, &ve) {
		return &NameError{name, ve.Reason}
	}
	return nil
}

// Bootstrap makes sure the layout of name exists: the concrete index
// name-000001, the write alias name-write (the only name outboxd writes
// through) and the filtered aliases name and name-read, which never show a
// tombstone. It creates what is missing and upgrades the layout of older
// releases (name an unfiltered write alias) in place with one atomic
// _aliases request: name is redefined, never removed, and no document is
// copied. It is idempotent and safe to run concurrently, from several
// processes too. It returns an *IncompatibleError, having changed nothing,
// when one of the names is a concrete index or the aliases are shaped
// differently.
func Bootstrap(ctx context.Context, es *elasticsearch.Client, name string, spec []byte) error {
	_, err := bootstrap(ctx, es, name, spec, nil)
	return err
}

// bootstrap is Bootstrap; created says it created name-000001.
// rebuilt (may be nil) names the index a recorded rebuild left name's
// documents in.
func bootstrap(ctx context.Context, es *elasticsearch.Client, name string, spec []byte, rebuilt func(context.Context, string) (string, error)) (created bool, err error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	body, err := indexBody(spec)
	if err != nil {
		return false, err
	}
	// Each round either finds everything in place or makes one change and
	// looks again; concurrent bootstraps converge within a few rounds.
	for range 5 {
		done, err := bootstrapStep(ctx, es, name, body, &created, rebuilt)
		if err != nil || done {
			return created, err
		}
	}
	return created, fmt.Errorf("indexer: bootstrap %q: the indices kept changing during bootstrap; try again", name)
}

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

func bootstrapStep(ctx context.Context, es *elasticsearch.Client, name string, body []byte, created *bool, rebuilt func(context.Context, string) (string, error)) (done bool, err error) {
	write, read, first := WriteAlias(name), ReadAlias(name), FirstIndex(name)
	raw, err := perform(ctx, es, "resolve index", esapi.IndicesResolveIndexRequest{
		Name:              []string{name, write, read, first},
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
	for _, n := range []string{name, write, read} {
		switch {
		case r.dataStream(n):
			return false, &IncompatibleError{name, n + " is a data stream; outboxd needs aliases"}
		case r.index(n) && n == name:
			return false, &IncompatibleError{name, "it is a concrete index, but outboxd needs the name for the filtered alias applications search; reindex it into " + first + " and replace it with the aliases " + name + ", " + write + " and " + read}
		case r.index(n):
			return false, &IncompatibleError{name, n + " is a concrete index, but outboxd needs it to be an alias"}
		}
	}
	// The index the layout lives on: the one behind the write alias, else
	// behind name (the layout of older releases, or made by hand: upgraded
	// in place), else name-000001, adopted or created.
	index := first
	for _, n := range []string{write, name} {
		if t := r.alias(n); t != nil {
			if len(t) != 1 {
				return false, &IncompatibleError{name, fmt.Sprintf("%s points at %d indices (%s); versions are only compared within one index, so outboxd needs exactly one", n, len(t), strings.Join(t, ", "))}
			}
			if err := foreignOwner(name, n, t[0]); err != nil {
				return false, err
			}
			index = t[0]
			break
		}
	}
	for _, n := range []string{write, name, read} {
		for _, t := range r.alias(n) {
			if t != index {
				return false, foreignTarget(name, n, t, index)
			}
		}
	}
	if r.alias(write) == nil && r.alias(name) == nil && !r.index(first) {
		// A later concrete index of name means its layout was there and
		// its aliases are gone: an empty name-000001 would hide its
		// documents and take the writes meant for them.
		if later, err := laterIndices(ctx, es, name); err != nil {
			return false, err
		} else if len(later) > 0 {
			return false, &LayoutLostError{Index: name, Reason: fmt.Sprintf("%s exists but %s, %s and %s point at no index; outboxd will not create an empty %s beside it: point the aliases at the index that holds the documents (outboxd migrate-index --index %s after adding %s to it) or delete it",
				strings.Join(later, ", "), name, write, read, first, name, write)}
		}
		if rebuilt != nil {
			// The later index may be gone too (deleted by hand): the
			// rebuilds table still says the layout lived there, and an
			// empty name-000001 would silently start the index over.
			home, err := rebuilt(ctx, name)
			if err != nil {
				return false, fmt.Errorf("indexer: bootstrap %q: reading the rebuilds table: %w", name, err)
			}
			if home != "" && home != first {
				return false, &LayoutLostError{Index: name, Reason: fmt.Sprintf("a rebuild moved its documents to %s, which is gone, and %s, %s and %s point at no index; outboxd will not create an empty %s in its place: restore %s (from a snapshot), or, to start the index over empty, run outboxd rebuild --index %s --forget",
					home, name, write, read, first, home, name)}
			}
		}
		create := append(append(body[:len(body)-1:len(body)-1], `,"aliases":{`...), aliasesJSON(name)...)
		create = append(create, "}}"...)
		_, err = perform(ctx, es, "create index "+first, esapi.IndicesCreateRequest{Index: first, Body: bytes.NewReader(create)})
		var re *ResponseError
		if errors.As(err, &re) && re.Type == "resource_already_exists_exception" {
			return false, nil // another process won the race; look again
		}
		*created = err == nil
		return false, err
	}
	return checkAliases(ctx, es, name, index, r.alias(write) != nil)
}

// laterIndices lists the concrete indices name-NNNNNN other than
// name-000001 (the ones rebuilds make).
func laterIndices(ctx context.Context, es *elasticsearch.Client, name string) ([]string, error) {
	raw, err := perform(ctx, es, "resolve index", esapi.IndicesResolveIndexRequest{
		Name:              []string{name + "-*"},
		ExpandWildcards:   "all",
		IgnoreUnavailable: &ptrTrue,
	})
	if err != nil {
		return nil, err
	}
	var r resolved
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("indexer: resolve index: %w", err)
	}
	var out []string
	for _, i := range r.Indices {
		suffix, _ := strings.CutPrefix(i.Name, name+"-")
		if len(suffix) == 6 && strings.Trim(suffix, "0123456789") == "" && i.Name != FirstIndex(name) {
			out = append(out, i.Name)
		}
	}
	return out, nil
}

// foreignTarget refuses alias (one of name's) pointing at index other
// than want, the index behind name: reading or writing through it would
// mix two indexes' documents, and outboxd never moves an alias another
// index uses.
func foreignTarget(name, alias, index, want string) error {
	if err := foreignOwner(name, alias, index); err != nil {
		return err
	}
	return &IncompatibleError{name, alias + " points at " + index + ", not at " + want + ", the index behind " + name + "; outboxd will not move an alias another index uses"}
}

// foreignOwner refuses alias pointing at index when index is the concrete
// index (M-NNNNNN) of another outboxd index M.
func foreignOwner(name, alias, index string) error {
	if s := outbox.ReservedSuffix(index); len(s) == len(FirstIndex("")) {
		if owner := index[:len(index)-len(s)]; owner != name {
			return &IncompatibleError{name, fmt.Sprintf("alias %s already points at %s, the concrete index of outboxd index %q; outboxd would mix the documents of %q and %q", alias, index, owner, name, owner)}
		}
	}
	return nil
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

// aliasesJSON is the "aliases" object of a new concrete index for name.
func aliasesJSON(name string) string {
	n, _ := json.Marshal(name)
	w, _ := json.Marshal(WriteAlias(name))
	rd, _ := json.Marshal(ReadAlias(name))
	return string(w) + `:{"is_write_index":true},` + string(n) + `:{"filter":` + ReadFilter + `},` + string(rd) + `:{"filter":` + ReadFilter + `}`
}

// checkAliases verifies the aliases on index and, in one atomic _aliases
// request, adds the missing ones and gives name the read filter (the
// upgrade from the layout where name was the unfiltered write alias). An
// "add" of an existing alias replaces its definition, so searches on name
// never find it missing. Anything else shaped differently is refused.
// viaWrite says index was found behind the write alias: if the alias is no
// longer on it, a rebuild has just moved the names to another index, and
// putting them back on this one would fail (N-write would have two write
// indices) or make N span both; look again instead.
func checkAliases(ctx context.Context, es *elasticsearch.Client, name, index string, viaWrite bool) (bool, error) {
	write, read := WriteAlias(name), ReadAlias(name)
	raw, err := perform(ctx, es, "get aliases", esapi.IndicesGetAliasRequest{Index: []string{index}})
	if err != nil {
		return false, err
	}
	var got map[string]struct {
		Aliases map[string]struct {
			IsWriteIndex *bool           `json:"is_write_index"`
			Filter       json.RawMessage `json:"filter"`
		} `json:"aliases"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		return false, fmt.Errorf("indexer: get aliases: %w", err)
	}
	have := got[index].Aliases
	if _, ok := have[write]; !ok && viaWrite {
		return false, nil
	}
	var actions []string
	add := func(alias, def string) {
		ix, _ := json.Marshal(index)
		a, _ := json.Marshal(alias)
		actions = append(actions, `{"add":{"index":`+string(ix)+`,"alias":`+string(a)+def+`}}`)
	}
	switch w, ok := have[write]; {
	case !ok:
		add(write, `,"is_write_index":true`)
	case w.IsWriteIndex != nil && !*w.IsWriteIndex:
		return false, &IncompatibleError{name, write + " is not a write alias (is_write_index is false on " + index + ")"}
	case len(w.Filter) > 0:
		return false, &IncompatibleError{name, write + " has filter " + string(w.Filter) + "; outboxd writes and reads tombstones through it, so it must have none"}
	}
	for _, alias := range []string{name, read} {
		a, ok := have[alias]
		switch {
		case ok && jsonEqual(a.Filter, []byte(ReadFilter)):
		case !ok, alias == name && len(a.Filter) == 0:
			add(alias, `,"filter":`+ReadFilter)
		default:
			return false, &IncompatibleError{name, alias + " has filter " + string(a.Filter) + "; outboxd needs " + ReadFilter + " so tombstones stay hidden"}
		}
	}
	if len(actions) > 0 {
		_, err := perform(ctx, es, "update aliases", esapi.IndicesUpdateAliasesRequest{Body: strings.NewReader(`{"actions":[` + strings.Join(actions, ",") + `]}`)})
		return false, err
	}
	// Harmless when present; adds the fields to an index made by hand.
	fields, _ := json.Marshal(map[string]any{"properties": outboxdFields})
	if _, err := perform(ctx, es, "put mapping", esapi.IndicesPutMappingRequest{Index: []string{index}, Body: bytes.NewReader(fields)}); err != nil {
		var re *ResponseError
		if errors.As(err, &re) && re.Status == 400 {
			return false, &IncompatibleError{name, "its mapping cannot hold the outboxd fields: " + re.Error()}
		}
		return false, err
	}
	return true, nil
}

// ensure bootstraps name once per Sink. Failures are not cached: the next
// Write tries again, so an operator's fix is picked up without a restart.
func (s *Sink) ensure(ctx context.Context, name string) error {
	s.mu.Lock()
	e := s.boot[name]
	if e == nil {
		e = &bootEntry{lock: make(chan struct{}, 1)}
		s.boot[name] = e
	}
	s.mu.Unlock()
	if e.ok.Load() {
		return nil
	}
	// Another Write may be bootstrapping name against a node that does not
	// answer; this one must still return by its own deadline.
	select {
	case e.lock <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("indexer: bootstrap %s: waiting for another write's bootstrap: %w", name, ctx.Err())
	}
	defer func() { <-e.lock }()
	if e.ok.Load() {
		return nil
	}
	created, err := bootstrap(ctx, s.es, name, s.spec, s.rebuilt)
	if err != nil {
		s.logger.Warn("indexer: bootstrap failed", slog.String("index", name), slog.String("error", err.Error()))
		return err
	}
	switch {
	case created && e.wasOK:
		s.logger.Warn("indexer: re-created the layout of an index that had vanished: "+FirstIndex(name)+" is new and empty; if its documents are in another index, point the aliases back at it",
			slog.String("index", name), slog.String("concrete_index", FirstIndex(name)))
	case created:
		s.logger.Info("indexer: created index", slog.String("index", name), slog.String("concrete_index", FirstIndex(name)))
	}
	e.wasOK = true
	e.ok.Store(true)
	return nil
}

// forget makes the next Write bootstrap name again (its write alias went
// missing).
func (s *Sink) forget(name string) {
	s.mu.Lock()
	e := s.boot[name]
	s.mu.Unlock()
	if e != nil {
		e.ok.Store(false)
	}
}

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

// CheckName is checkName for the operator tools (packages repair,
// rebuild, backfill, reconcile): a backfill refuses an index name before it reads a row.
func CheckName(name string) error { return checkName(name) }

// WriteTarget is writeTarget for the operator tools, which resolve the name an operator gives to the index behind it.
func WriteTarget(ctx context.Context, es *elasticsearch.Client, name string) (string, error) {
	return writeTarget(ctx, es, name)
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
