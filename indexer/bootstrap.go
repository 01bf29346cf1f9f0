package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/outbox"
)

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
