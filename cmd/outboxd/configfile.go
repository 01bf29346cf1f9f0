package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	// The YAML organisation's maintained continuation of gopkg.in/yaml.v3
	// (archived in April 2025), with the same API: Decoder.KnownFields
	// reports an unknown key with its line, and yaml.Node keeps the line
	// of every value, so errors name the key and the line, never the value.
	"go.yaml.in/yaml/v3"
)

// The --config file: a YAML mapping of the relay's settings, laid out as
// docs/deploy/outboxd.yaml shows. Every value is kept as written (a
// setting, with its line) until the command knows which keys it takes:
// relay and check take every key, the other commands those of database and
// search (the connection settings). Only then are ${VAR}s expanded, so a
// variable the command does not need may be unset.

// fileConfig is the file's layout. A setting's flag tag names the flag it
// sets; env names the environment-only setting it stands for; kind says
// how its value is read (see fileKey.value). conn marks the sections every
// command with connection flags takes.
type fileConfig struct {
	Database        fileDatabase      `yaml:"database" conn:"true"`
	Search          fileSearch        `yaml:"search" conn:"true"`
	Streams         fileStreams       `yaml:"streams"`
	Pages           filePages         `yaml:"pages"`
	Indexing        fileIndexing      `yaml:"indexing"`
	Retries         fileRetries       `yaml:"retries"`
	ShutdownTimeout setting           `yaml:"shutdown_timeout" flag:"shutdown-timeout"`
	MemoryLimit     setting           `yaml:"memory_limit" flag:"memory-limit"`
	Admin           fileAdmin         `yaml:"admin"`
	Retention       fileRetention     `yaml:"retention"`
	Schedules       fileSchedules     `yaml:"schedules"`
	Reconcile       fileReconcile     `yaml:"reconcile"`
	Destinations    []fileDestination `yaml:"destinations"`
}

type fileDatabase struct {
	URL    setting `yaml:"url" flag:"database-url" kind:"url"`
	Schema setting `yaml:"schema" flag:"schema"`
}

type fileSearch struct {
	URLs            setting `yaml:"urls" flag:"elasticsearch-url" kind:"urls"`
	Timeout         setting `yaml:"timeout" flag:"elasticsearch-timeout"`
	Username        setting `yaml:"username" env:"ELASTICSEARCH_USERNAME"`
	Password        setting `yaml:"password" env:"ELASTICSEARCH_PASSWORD" kind:"secret"`
	APIKey          setting `yaml:"api_key" env:"ELASTICSEARCH_API_KEY" kind:"secret"`
	CACert          setting `yaml:"ca_cert" env:"ELASTICSEARCH_CA_CERT" kind:"path"`
	ClientCert      setting `yaml:"client_cert" env:"ELASTICSEARCH_CLIENT_CERT" kind:"path"`
	ClientKey       setting `yaml:"client_key" env:"ELASTICSEARCH_CLIENT_KEY" kind:"path"`
	CertFingerprint setting `yaml:"cert_fingerprint" env:"ELASTICSEARCH_CERT_FINGERPRINT"`
	AWS             fileAWS `yaml:"aws"`
}

type fileAWS struct {
	SigV4   setting `yaml:"sigv4" flag:"aws-sigv4"`
	Region  setting `yaml:"region" flag:"aws-region"`
	Service setting `yaml:"service" flag:"aws-service"`
}

type fileStreams struct {
	Name          setting `yaml:"name" flag:"stream"`
	Partitions    setting `yaml:"partitions" flag:"partitions"`
	Indexes       setting `yaml:"indexes" flag:"indexes" kind:"list"`
	LeaseInterval setting `yaml:"lease_interval" flag:"lease-interval"`
}

type filePages struct {
	BatchDocs     setting `yaml:"batch_docs" flag:"batch-docs"`
	BatchBytes    setting `yaml:"batch_bytes" flag:"batch-bytes" kind:"size"`
	Prefetch      setting `yaml:"prefetch" flag:"prefetch"`
	InFlight      setting `yaml:"in_flight" flag:"in-flight"`
	Linger        setting `yaml:"linger" flag:"linger"`
	LingerDocs    setting `yaml:"linger_docs" flag:"linger-docs"`
	MinPoll       setting `yaml:"min_poll" flag:"min-poll"`
	MaxPoll       setting `yaml:"max_poll" flag:"max-poll"`
	QuietAfter    setting `yaml:"quiet_after" flag:"quiet-after"`
	QuietPoll     setting `yaml:"quiet_poll" flag:"quiet-poll"`
	Wakeup        setting `yaml:"wakeup" flag:"wakeup"`
	StoreInterval setting `yaml:"store_interval" flag:"store-interval"`
}

type fileIndexing struct {
	IndexSpec      setting `yaml:"index_spec" flag:"index-spec" kind:"path"`
	UpgradeLayouts setting `yaml:"upgrade_layouts" flag:"upgrade-layouts"`
	BulkDocs       setting `yaml:"bulk_docs" flag:"bulk-docs"`
	BulkBytes      setting `yaml:"bulk_bytes" flag:"bulk-bytes" kind:"size"`
	BulkWorkers    setting `yaml:"bulk_workers" flag:"bulk-workers"`
	// DocumentsTimeout bounds a definition-fed index's SQL (package documents).
	DocumentsTimeout setting `yaml:"documents_timeout" flag:"documents-timeout"`
}

type fileRetries struct {
	MaxAttempts setting `yaml:"max_attempts" flag:"max-attempts"`
	BackoffBase setting `yaml:"backoff_base" flag:"backoff-base"`
	BackoffMax  setting `yaml:"backoff_max" flag:"backoff-max"`
}

type fileAdmin struct {
	Addr           setting `yaml:"addr" flag:"admin-addr"`
	Token          setting `yaml:"token" flag:"admin-token" kind:"secret"`
	Hosts          setting `yaml:"hosts" flag:"admin-host" kind:"list"`
	AbandonedAfter setting `yaml:"abandoned_after" flag:"abandoned-after"`
}

type fileRetention struct {
	Events     setting `yaml:"events" flag:"retention"`
	Ledger     setting `yaml:"ledger" flag:"ledger-retention"`
	Tombstones setting `yaml:"tombstones" flag:"tombstone-horizon"`
}

type fileSchedules struct {
	Retention       setting `yaml:"retention" flag:"retention-schedule"`
	TombstonePurge  setting `yaml:"tombstone_purge" flag:"tombstone-purge-schedule"`
	DeadletterRetry setting `yaml:"deadletter_retry" flag:"deadletter-retry-schedule"`
	Reconcile       setting `yaml:"reconcile" flag:"reconcile-schedule"`
	JobTimeout      setting `yaml:"job_timeout" flag:"job-timeout"`
}

type fileReconcile struct {
	Index      setting `yaml:"index" flag:"reconcile-index"`
	SQL        setting `yaml:"sql" flag:"reconcile-sql"`
	Apply      setting `yaml:"apply" flag:"reconcile-apply"`
	SQLTimeout setting `yaml:"sql_timeout" flag:"reconcile-sql-timeout"`
}

// fileDestination is one --destination: its keys are the flag's options
// (webhook.ParseDestination), name and url first, check last.
type fileDestination struct {
	Name                setting `yaml:"name"`
	URL                 setting `yaml:"url" kind:"url"`
	SecretEnv           setting `yaml:"secret_env"`
	PreviousSecretEnv   setting `yaml:"previous_secret_env"`
	PreviousSecretUntil setting `yaml:"previous_secret_until"`
	CAFile              setting `yaml:"ca_file" kind:"path"`
	Idempotent          setting `yaml:"idempotent"`
	Retry5xx            setting `yaml:"retry_5xx"`
	Timeout             setting `yaml:"timeout"`
	Concurrency         setting `yaml:"concurrency"`
	Rate                setting `yaml:"rate"`
	BreakerFailures     setting `yaml:"breaker_failures"`
	BreakerCooldown     setting `yaml:"breaker_cooldown"`
	CheckTimeout        setting `yaml:"check_timeout"`
	Check               setting `yaml:"check"`
}

// setting is one value of the file as written, with its line; nil node:
// the file does not set it.
type setting struct{ node *yaml.Node }

func (s *setting) UnmarshalYAML(n *yaml.Node) error {
	s.node = n
	return nil
}

// loadConfigFile reads path and checks its layout: unknown keys, and a
// value where a section belongs or the reverse, each named with its line.
// The values themselves are read when a command applies them.
func loadConfigFile(path string) (*fileConfig, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	var c fileConfig
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlError(path, err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: more than one YAML document (a --- line): give every setting in one", path)
	}
	// The decoder leaves a key without a value (or ~, null) unset without
	// a word; the file's author meant something by it.
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		return nil, yamlError(path, err)
	}
	if errs := nullValues(path, &root, ""); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &c, nil
}

// nullValues reports each key and list item of n without a value.
func nullValues(path string, n *yaml.Node, key string) []error {
	var errs []error
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			errs = append(errs, nullValues(path, c, key)...)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			errs = append(errs, nullValues(path, n.Content[i+1], joinKey(key, n.Content[i].Value))...)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			errs = append(errs, nullValues(path, c, key+"["+strconv.Itoa(i)+"]")...)
		}
	case yaml.ScalarNode:
		if n.Tag == "!!null" && key != "" {
			errs = append(errs, fmt.Errorf(`%s:%d: %s: no value (write "" for an empty one, or leave the key out)`, path, n.Line, key))
		}
	}
	return errs
}

var (
	yamlUnknownKey = regexp.MustCompile(`^line (\d+): field (.+) not found in type (\S+)$`)
	yamlWrongKind  = regexp.MustCompile("^line (\\d+): cannot unmarshal (!!\\w+)(?: `[^`]*`)? into (\\S+)$")
	yamlLine       = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)
	yamlQuoted     = regexp.MustCompile("`[^`]*`")
)

// yamlError rewrites the decoder's errors as path:line: key: reason. The
// decoder quotes the start of a value it cannot place; that goes.
func yamlError(path string, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		msg := yamlQuoted.ReplaceAllString(err.Error(), "a value")
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			return fmt.Errorf("%s:%s: %s", path, m[1], m[2])
		}
		return fmt.Errorf("%s: %s", path, strings.TrimPrefix(msg, "yaml: "))
	}
	secs := fileSections()
	var errs []error
	for _, msg := range te.Errors {
		if m := yamlUnknownKey.FindStringSubmatch(msg); m != nil {
			sec := secs[m[3]]
			in := ""
			if sec.path != "" {
				in = " in " + sec.path
			}
			errs = append(errs, fmt.Errorf("%s:%s: unknown key %q%s (known: %s)", path, m[1], m[2], in, strings.Join(sec.keys, ", ")))
			continue
		}
		if m := yamlWrongKind.FindStringSubmatch(msg); m != nil {
			sec := secs[m[3]]
			name, want := sec.path, "a mapping of keys"
			if strings.HasPrefix(m[3], "[]") {
				want = "a list"
			}
			if name == "" {
				name = "the file"
			}
			errs = append(errs, fmt.Errorf("%s:%s: %s: %s where %s belongs", path, m[1], name, yamlKind(m[2]), want))
			continue
		}
		errs = append(errs, fmt.Errorf("%s: %s", path, yamlQuoted.ReplaceAllString(msg, "a value")))
	}
	return errors.Join(errs...)
}

func yamlKind(tag string) string {
	switch tag {
	case "!!seq":
		return "a list"
	case "!!map":
		return "a mapping"
	}
	return "a single value"
}

// fileSection names a section of the layout in errors, with its keys.
type fileSection struct {
	path string
	keys []string
}

// fileSections maps the layout's Go types (as the decoder names them) to
// the sections they hold.
func fileSections() map[string]fileSection {
	out := map[string]fileSection{}
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		var keys []string
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := yamlName(f)
			keys = append(keys, name)
			sub := joinKey(path, name)
			switch {
			case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(setting{}):
				walk(f.Type, sub)
			case f.Type.Kind() == reflect.Slice:
				out[f.Type.String()] = fileSection{path: sub}
				walk(f.Type.Elem(), "an item of "+sub)
			}
		}
		sort.Strings(keys)
		out[t.String()] = fileSection{path: path, keys: keys}
	}
	walk(reflect.TypeOf(fileConfig{}), "")
	return out
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}

func joinKey(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// fileKey is one setting the file sets, with where it goes.
type fileKey struct {
	path string // e.g. pages.linger, destinations[0].url
	flag string // the flag it sets, or ""
	env  string // the environment-only setting it stands for, or ""
	kind string // "", list, url, urls, path, size, secret
	conn bool   // a connection setting, which every command takes
	node *yaml.Node
}

// fileKeys lists the settings of c that the file sets, in the layout's
// order; destinations are apart (fileDestinationSpecs).
func fileKeys(c *fileConfig) []fileKey {
	var out []fileKey
	var walk func(v reflect.Value, path string, conn bool)
	walk = func(v reflect.Value, path string, conn bool) {
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			sub := joinKey(path, yamlName(f))
			switch s := v.Field(i).Interface().(type) {
			case setting:
				if s.node != nil {
					out = append(out, fileKey{path: sub, flag: f.Tag.Get("flag"), env: f.Tag.Get("env"), kind: f.Tag.Get("kind"), conn: conn, node: s.node})
				}
			default:
				if f.Type.Kind() == reflect.Struct {
					walk(v.Field(i), sub, conn || f.Tag.Get("conn") == "true")
				}
			}
		}
	}
	walk(reflect.ValueOf(c).Elem(), "", false)
	return out
}

// destinationKeys lists the options one destination of the file sets, in
// the layout's order (name, url, ..., check).
func destinationKeys(d fileDestination, i int) []fileKey {
	var out []fileKey
	v, t := reflect.ValueOf(d), reflect.TypeOf(d)
	for j := 0; j < t.NumField(); j++ {
		f := t.Field(j)
		if s := v.Field(j).Interface().(setting); s.node != nil {
			out = append(out, fileKey{path: "destinations[" + strconv.Itoa(i) + "]." + yamlName(f), kind: f.Tag.Get("kind"), node: s.node})
		}
	}
	return out
}
