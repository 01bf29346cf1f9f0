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
)

// ReadFilter is the filter of the search names N and N-read: tombstones
// are documents too, and searchers must never see them.
const ReadFilter = `{"bool":{"must_not":{"term":{"outboxd_deleted":true}}}}`

// outboxdFields are merged into every mapping, default or user supplied.
var outboxdFields = map[string]any{
	"outboxd_deleted":    map[string]any{"type": "boolean"},
	"outboxd_deleted_at": map[string]any{"type": "date"},
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

// checkName applies Elasticsearch's index name rules to name and the names
// derived from it.
func checkName(name string) error {
	switch {
	case name == "":
		return &NameError{name, "must not be empty"}
	case name == "." || name == "..":
		return &NameError{name, `must not be "." or ".."`}
	case strings.ContainsAny(name[:1], "-_+"):
		return &NameError{name, "must not start with '-', '_' or '+'"}
	case strings.ToLower(name) != name:
		return &NameError{name, "must be lowercase"}
	case strings.ContainsAny(name, "\\/*?\"<>| ,#:"):
		return &NameError{name, `must not contain \ / * ? " < > | space , # :`}
	case len(FirstIndex(name)) > 255:
		return &NameError{name, "too long: at most 248 bytes (Elasticsearch allows 255 and outboxd appends -000001)"}
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
	if err := checkName(name); err != nil {
		return err
	}
	body, err := indexBody(spec)
	if err != nil {
		return err
	}
	// Each round either finds everything in place or makes one change and
	// looks again; concurrent bootstraps converge within a few rounds.
	for range 5 {
		done, err := bootstrapStep(ctx, es, name, body)
		if err != nil || done {
			return err
		}
	}
	return fmt.Errorf("indexer: bootstrap %q: the indices kept changing during bootstrap; try again", name)
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

func bootstrapStep(ctx context.Context, es *elasticsearch.Client, name string, body []byte) (done bool, err error) {
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
	var index string
	switch {
	case r.alias(write) != nil:
		if t := r.alias(write); len(t) != 1 {
			return false, &IncompatibleError{name, fmt.Sprintf("%s points at %d indices (%s); versions are only compared within one index, so outboxd needs exactly one", write, len(t), strings.Join(t, ", "))}
		}
		index = r.alias(write)[0]
	case r.alias(name) != nil:
		// The layout of older releases (name the write alias), or made by
		// hand: upgraded in place below.
		if t := r.alias(name); len(t) != 1 {
			return false, &IncompatibleError{name, fmt.Sprintf("the alias points at %d indices (%s); versions are only compared within one index, so outboxd needs exactly one", len(t), strings.Join(t, ", "))}
		}
		index = r.alias(name)[0]
	case r.index(first):
		index = first // created by hand, or its aliases were removed: adopt it
	default:
		create := append(append(body[:len(body)-1:len(body)-1], `,"aliases":{`...), aliasesJSON(name)...)
		create = append(create, "}}"...)
		_, err = perform(ctx, es, "create index "+first, esapi.IndicesCreateRequest{Index: first, Body: bytes.NewReader(create)})
		var re *ResponseError
		if errors.As(err, &re) && re.Type == "resource_already_exists_exception" {
			return false, nil // another process won the race; look again
		}
		return false, err
	}
	for _, n := range []string{name, read} {
		if t := r.alias(n); t != nil && (len(t) != 1 || t[0] != index) {
			return false, &IncompatibleError{name, n + " points at " + strings.Join(t, ", ") + ", not at " + index + ", the index behind " + write + "; outboxd will not move an alias another index uses"}
		}
	}
	return checkAliases(ctx, es, name, index, r.alias(write) != nil)
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
		e = &bootEntry{}
		s.boot[name] = e
	}
	s.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ok {
		return nil
	}
	if err := Bootstrap(ctx, s.es, name, s.spec); err != nil {
		s.logger.Warn("indexer: bootstrap failed", slog.String("index", name), slog.String("error", err.Error()))
		return err
	}
	e.ok = true
	return nil
}

// forget makes the next Write bootstrap name again (its write alias went
// missing).
func (s *Sink) forget(name string) {
	s.mu.Lock()
	if e := s.boot[name]; e != nil {
		s.mu.Unlock()
		e.mu.Lock()
		e.ok = false
		e.mu.Unlock()
		return
	}
	s.mu.Unlock()
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
		done, err := bootstrapStep(ctx, es, name, body)
		if err != nil || done {
			return changed, err
		}
		changed = true
	}
	return changed, fmt.Errorf("indexer: migrate %q: the indices kept changing; try again", name)
}
