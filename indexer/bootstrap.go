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

// ReadFilter is the filter of every read alias N-read: tombstones are
// documents too, and searchers must never see them.
const ReadFilter = `{"bool":{"must_not":{"term":{"outboxd_deleted":true}}}}`

// outboxdFields are merged into every mapping, default or user supplied.
var outboxdFields = map[string]any{
	"outboxd_deleted":    map[string]any{"type": "boolean"},
	"outboxd_deleted_at": map[string]any{"type": "date"},
}

// FirstIndex and ReadAlias name what Bootstrap creates for the write alias name.
func FirstIndex(name string) string { return name + "-000001" }
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
				return nil, errors.New("indexer: index spec: aliases: outboxd owns the aliases (N and N-read); remove this key")
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

// Bootstrap makes sure the write alias name, its concrete index
// name-000001 and the filtered read alias name-read exist, creating what is
// missing. It is idempotent and safe to run concurrently, from several
// processes too. It returns an *IncompatibleError, having changed nothing,
// when name is a concrete index or the aliases are shaped differently.
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
	read, first := ReadAlias(name), FirstIndex(name)
	raw, err := perform(ctx, es, "resolve index", esapi.IndicesResolveIndexRequest{
		Name:              []string{name, read, first},
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
	switch {
	case r.index(name):
		return false, &IncompatibleError{name, "it is a concrete index, but outboxd writes through a write alias of that name; reindex it into " + first + " and replace it with the aliases " + name + " and " + read}
	case r.dataStream(name) || r.dataStream(read):
		return false, &IncompatibleError{name, "it or " + read + " is a data stream; outboxd needs aliases"}
	case r.index(read):
		return false, &IncompatibleError{name, read + " is a concrete index, but outboxd needs it to be the filtered read alias"}
	}
	if targets := r.alias(name); targets != nil {
		return checkAliases(ctx, es, name, targets, r.alias(read) != nil)
	}
	if r.index(first) {
		// Created by hand, or its aliases were removed: adopt it.
		return false, addAliases(ctx, es, first, name, read, r.alias(read) == nil)
	}
	create := append(append(body[:len(body)-1:len(body)-1], `,"aliases":{`...), aliasesJSON(name, read)...)
	create = append(create, "}}"...)
	_, err = perform(ctx, es, "create index "+first, esapi.IndicesCreateRequest{Index: first, Body: bytes.NewReader(create)})
	var re *ResponseError
	if errors.As(err, &re) && re.Type == "resource_already_exists_exception" {
		return false, nil // another process won the race; look again
	}
	return false, err
}

func aliasesJSON(name, read string) string {
	n, _ := json.Marshal(name)
	rd, _ := json.Marshal(read)
	return string(n) + `:{"is_write_index":true},` + string(rd) + `:{"filter":` + ReadFilter + `}`
}

func addAliases(ctx context.Context, es *elasticsearch.Client, index, name, read string, withRead bool) error {
	ix, _ := json.Marshal(index)
	n, _ := json.Marshal(name)
	rd, _ := json.Marshal(read)
	actions := `{"add":{"index":` + string(ix) + `,"alias":` + string(n) + `,"is_write_index":true}}`
	if name == "" {
		actions = ""
	}
	if withRead {
		if actions != "" {
			actions += ","
		}
		actions += `{"add":{"index":` + string(ix) + `,"alias":` + string(rd) + `,"filter":` + ReadFilter + `}}`
	}
	_, err := perform(ctx, es, "add aliases", esapi.IndicesUpdateAliasesRequest{Body: strings.NewReader(`{"actions":[` + actions + `]}`)})
	return err
}

// checkAliases verifies an existing write alias and completes what is
// missing without touching anything that exists.
func checkAliases(ctx context.Context, es *elasticsearch.Client, name string, targets []string, haveRead bool) (bool, error) {
	read := ReadAlias(name)
	if len(targets) != 1 {
		return false, &IncompatibleError{name, fmt.Sprintf("the alias points at %d indices (%s); versions are only compared within one index, so outboxd needs exactly one", len(targets), strings.Join(targets, ", "))}
	}
	index := targets[0]
	names := []string{name}
	if haveRead {
		names = append(names, read)
	}
	raw, err := perform(ctx, es, "get aliases", esapi.IndicesGetAliasRequest{Name: names})
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
	if w := got[index].Aliases[name].IsWriteIndex; w != nil && !*w {
		return false, &IncompatibleError{name, "the alias is not a write alias (is_write_index is false on " + index + ")"}
	}
	if !haveRead {
		return false, addAliases(ctx, es, index, "", read, true)
	}
	ra, ok := got[index].Aliases[read]
	if !ok {
		return false, &IncompatibleError{name, read + " exists but does not cover " + index + ", the index behind " + name}
	}
	if !jsonEqual(ra.Filter, []byte(ReadFilter)) {
		return false, &IncompatibleError{name, read + " has filter " + string(ra.Filter) + "; outboxd needs " + ReadFilter + " so tombstones stay hidden"}
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
	if err := Bootstrap(ctx, s.es, name, s.spec); err != nil {
		s.logger.Warn("indexer: bootstrap failed", slog.String("index", name), slog.String("error", err.Error()))
		return err
	}
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
