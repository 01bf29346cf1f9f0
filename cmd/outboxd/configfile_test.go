package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/webhook"
)

// writeConfig writes text (its leading newline dropped) as outboxd.yaml
// in a directory of its own and returns the path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(path, []byte(strings.TrimPrefix(text, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// relayConfigError parses the relay's flags from the file and returns the
// error, which must not be nil.
func relayConfigError(t *testing.T, text string, args ...string) string {
	t.Helper()
	_, _, _, err := parseRelayFlags(append([]string{"--config", writeConfig(t, text)}, args...))
	if err == nil {
		t.Fatalf("no error for:\n%s", text)
	}
	return err.Error()
}

func wantIn(t *testing.T, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%q does not contain %q", got, w)
		}
	}
}

func wantNotIn(t *testing.T, got string, not ...string) {
	t.Helper()
	for _, n := range not {
		if strings.Contains(got, n) {
			t.Errorf("%q contains %q", got, n)
		}
	}
}

func TestConfigFileSetsTheRelayFlags(t *testing.T) {
	// Not parallel: it sets the environment.
	t.Setenv("OUTBOXD_T_DB", "postgres://u:pw-from-env@127.0.0.1:1/db")
	t.Setenv("OUTBOXD_T_ESPW", "es-pw-from-env")
	t.Setenv("OUTBOXD_T_TOKEN", "admin-token-from-env")
	path := writeConfig(t, `
database:
  url: ${OUTBOXD_T_DB}
  schema: custom
search:
  urls: [http://es1:9200, http://es2:9200]
  timeout: 7s
  username: outboxd
  password: ${OUTBOXD_T_ESPW}
  ca_cert: ca.pem
  aws: {service: aoss}
streams:
  name: s
  partitions: 3
  indexes: [a, b]
pages:
  batch_bytes: 2MiB
  linger: 0s
  wakeup: true
indexing:
  index_spec: spec.json
  bulk_bytes: 1048576
shutdown_timeout: 20s
memory_limit: 512MiB
admin:
  addr: ""
  token: ${OUTBOXD_T_TOKEN}
  hosts: [relay-1, relay-2.internal:9464]
retention: {events: 24h, ledger: 48h}
schedules:
  deadletter_retry: "@every 5m"
reconcile:
  sql: |
    SELECT id, version, doc
    FROM articles
destinations:
  - name: billing
    url: https://billing.internal/hooks
    secret_env: OUTBOXD_T_BILLING
    idempotent: true
    rate: 50/s
    check: SELECT $1 <> '', $2::jsonb IS NOT NULL
`)
	dir := filepath.Dir(path)
	db, es, f, err := parseRelayFlags([]string{"--config", path})
	if err != nil {
		t.Fatal(err)
	}
	c, err := es.config()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []struct {
		name      string
		got, want any
	}{
		{"database.url", db.url, "postgres://u:pw-from-env@127.0.0.1:1/db"},
		{"database.schema", db.schema, "custom"},
		{"search.urls", c.Addresses, []string{"http://es1:9200", "http://es2:9200"}},
		{"search.timeout", c.Timeout, 7 * time.Second},
		{"search.username", c.Username, "outboxd"},
		{"search.password", c.Password, "es-pw-from-env"},
		{"search.ca_cert, from the file's directory", c.CACertPath, filepath.Join(dir, "ca.pem")},
		{"search.aws.service", es.awsService, "aoss"},
		{"streams.name", f.streamPrefix, "s"},
		{"streams.partitions", f.partitions, 3},
		{"streams.indexes", f.indexes, "a,b"},
		{"pages.batch_bytes", f.batchBytes, 2 << 20},
		{"pages.linger", f.linger, time.Duration(0)},
		{"pages.wakeup", f.wakeup, true},
		{"indexing.index_spec, from the file's directory", f.indexSpec, filepath.Join(dir, "spec.json")},
		{"indexing.bulk_bytes", f.bulkBytes, 1 << 20},
		{"shutdown_timeout", f.shutdown, 20 * time.Second},
		{"memory_limit", f.memoryLimit, "512MiB"},
		{"admin.addr", f.adminAddr, ""},
		{"admin.token", f.adminToken, "admin-token-from-env"},
		{"admin.hosts", []string(f.adminHosts), []string{"relay-1", "relay-2.internal:9464"}},
		{"retention.events", f.retention, 24 * time.Hour},
		{"retention.ledger", f.ledgerRetention, 48 * time.Hour},
		{"schedules.deadletter_retry", f.deadletterRetrySchedule, "@every 5m"},
		{"reconcile.sql", f.reconcileSQL, "SELECT id, version, doc\nFROM articles\n"},
		{"the defaults of the keys the file leaves out", []any{f.batchDocs, f.maxAttempts, f.retentionSchedule}, []any{8000, 10, "@every 10m"}},
		{"destinations", []string(f.destinations), []string{"billing=https://billing.internal/hooks,secret_env=OUTBOXD_T_BILLING,idempotent=true,rate=50/s,check=SELECT $1 <> '', $2::jsonb IS NOT NULL"}},
	} {
		if !reflect.DeepEqual(g.got, g.want) {
			t.Errorf("%s: got %#v, want %#v", g.name, g.got, g.want)
		}
	}
	d, err := webhook.ParseDestination(f.destinations[0], func(string) string { return "whsec_c2VjcmV0" })
	if err != nil || d.Name != "billing" || !d.Idempotent || d.Rate != 50 || d.Check != "SELECT $1 <> '', $2::jsonb IS NOT NULL" {
		t.Errorf("the destination reads back as %+v, %v", d, err)
	}
	t.Run("the secrets the file took from the environment are redacted from output", func(t *testing.T) {
		out := secrets.String("es-pw-from-env admin-token-from-env postgres://u:pw-from-env@127.0.0.1:1/db")
		wantNotIn(t, out, "es-pw-from-env", "admin-token-from-env", "pw-from-env")
		// A variable that is a whole URL is redacted as URLs are: the host stays.
		wantIn(t, out, "postgres://u:xxxxx@127.0.0.1:1/db")
	})
}

func TestConfigVariableExpansion(t *testing.T) {
	t.Parallel()
	env := map[string]string{"A": "alpha", "EMPTY": "", "URL": "https://x/y"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, c := range []struct {
		in, want string
		whole    bool
	}{
		{"${A}", "alpha", true},
		{"x${A}y", "xalphay", false},
		{"${A}${A}", "alphaalpha", false},
		{"$$", "$", false},
		{"$${A}", "${A}", false},
		{"$$$${A}", "$${A}", false},
		{"$$$$${A}", "$$alpha", false},
		{"SELECT $1 <> '' AND $2::jsonb ? 'k'", "SELECT $1 <> '' AND $2::jsonb ? 'k'", false},
		{"costs $5 or $", "costs $5 or $", false},
		{"${EMPTY}", "", true},
		{"${URL}", "https://x/y", true},
	} {
		got, _, whole, err := expandVars(c.in, lookup)
		if err != nil || got != c.want || whole != c.whole {
			t.Errorf("expandVars(%q) = %q, whole %v, %v; want %q, whole %v", c.in, got, whole, err, c.want, c.whole)
		}
	}
	for in, want := range map[string]string{
		"${NOPE}":      "environment variable NOPE is not set",
		"a${A":         "without its closing }",
		"${1A}":        "not a variable name",
		"${A B}":       "not a variable name",
		"${}":          "not a variable name",
		"x ${NOPE} y":  "NOPE is not set",
		"${A}${NOPE2}": "NOPE2 is not set",
	} {
		if _, _, _, err := expandVars(in, lookup); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("expandVars(%q): %v, want %q", in, err, want)
		}
	}
}

func TestConfigFileErrorsNameTheKeyAndLineNotTheValue(t *testing.T) {
	// Not parallel: it sets the environment.
	t.Setenv("OUTBOXD_T_SECRET", "sEcret-from-env-1234")
	t.Run("an unset variable names the variable, the key and the line", func(t *testing.T) {
		err := relayConfigError(t, "database:\n  schema: outbox\n  url: ${OUTBOXD_T_UNSET}\n")
		wantIn(t, err, "outboxd.yaml:3: database.url: environment variable OUTBOXD_T_UNSET is not set")
	})
	t.Run("a bad value taken from a variable is named by key and line, never shown", func(t *testing.T) {
		err := relayConfigError(t, "pages:\n  linger: ${OUTBOXD_T_SECRET}\n")
		wantIn(t, err, "outboxd.yaml:2: pages.linger: not a duration")
		wantNotIn(t, err, "sEcret")
		if got := secrets.String("x sEcret-from-env-1234 y"); got != "x xxxxx y" {
			t.Errorf("the expanded value is not redacted: %q", got)
		}
	})
	for _, c := range []struct{ name, file, want string }{
		{"a word where a number belongs", "streams:\n  partitions: many\n", "outboxd.yaml:2: streams.partitions: not a whole number"},
		{"a word where a duration belongs", "\nretries:\n  backoff_max: soon\n", "outboxd.yaml:2: retries.backoff_max: not a duration"},
		{"a word where a boolean belongs", "indexing:\n  upgrade_layouts: maybe\n", "outboxd.yaml:2: indexing.upgrade_layouts: not true or false"},
		{"a size without a number", "pages:\n  batch_bytes: lots\n", "outboxd.yaml:2: pages.batch_bytes: not a size in bytes"},
		{"a list where one value belongs", "streams:\n  name: [a, b]\n", "outboxd.yaml:2: streams.name: a list where a single value belongs"},
		{"a mapping where one value belongs", "admin:\n  addr: {host: x}\n", "outboxd.yaml:2: admin.addr: a mapping where a value belongs"},
		{"a key without a value", "admin:\n  addr:\n", `outboxd.yaml:2: admin.addr: no value (write "" for an empty one`},
		{"a value where a section belongs", "database: postgres://u:hunter2@db/app\n", "outboxd.yaml:1: database: a single value where a mapping of keys belongs"},
		{"a mapping where the destinations' list belongs", "destinations:\n  billing: {url: x}\n", "outboxd.yaml:2: destinations: a mapping where a list belongs"},
		{"a value the relay refuses names the key", "pages:\n  linger: -1s\n", "outboxd.yaml:2: pages.linger: must be >= 0"},
		{"a memory limit without a unit names the key", "memory_limit: 512\n", "outboxd.yaml:1: memory_limit: \"512\" has no unit"},
		{"a destination URL with a comma", "destinations:\n  - name: a\n    url: https://h/x?a=1,2\n    secret_env: S\n", "outboxd.yaml:3: destinations[0].url: holds a comma"},
		{"a destination without a url", "destinations:\n  - name: a\n    secret_env: S\n", "outboxd.yaml:2: destinations[0]: needs a name and a url"},
		{"a YAML syntax error", "database:\n  url: x\n schema: y\n", "outboxd.yaml:2: did not find expected key"},
		{"two documents", "database: {schema: a}\n---\ndatabase: {schema: b}\n", "more than one YAML document"},
		{"an unset config file", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.file == "" {
				_, _, _, err := parseRelayFlags([]string{"--config", filepath.Join(t.TempDir(), "none.yaml")})
				if err == nil || !strings.Contains(err.Error(), "none.yaml") {
					t.Errorf("a missing file: %v", err)
				}
				return
			}
			err := relayConfigError(t, c.file)
			wantIn(t, err, c.want)
			wantNotIn(t, err, "many", "soon", "maybe", "lots", "hunter2", "postgres:")
		})
	}
	t.Run("every problem of the file is reported at once", func(t *testing.T) {
		err := relayConfigError(t, "streams:\n  partitions: x\npages:\n  prefetch: y\n")
		wantIn(t, err, "outboxd.yaml:2: streams.partitions", "outboxd.yaml:4: pages.prefetch")
	})
}

func TestConfigFileUnknownKeys(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, file string }{
		{"at the top", "database: {schema: x}\ndatabse:\n  url: x\n"},
		{"in a section", "search:\n  timeout: 5s\n  url: http://es:9200\n"},
		{"in a nested section", "search:\n  aws:\n    sigv4: true\n    regoin: eu-west-1\n"},
		{"in a destination", "destinations:\n  - name: a\n    url: http://h\n    secret: x\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := relayConfigError(t, c.file)
			want := map[string]string{
				"at the top":          `outboxd.yaml:2: unknown key "databse" (known: admin, database, destinations,`,
				"in a section":        `outboxd.yaml:3: unknown key "url" in search (known: api_key, aws, ca_cert,`,
				"in a nested section": `outboxd.yaml:4: unknown key "regoin" in search.aws (known: region, service, sigv4)`,
				"in a destination":    `outboxd.yaml:4: unknown key "secret" in an item of destinations (known: breaker_cooldown, breaker_failures, ca_file, check,`,
			}[c.name]
			wantIn(t, err, want)
			wantNotIn(t, err, "main.", "eu-west-1")
		})
	}
	t.Run("several unknown keys are all named", func(t *testing.T) {
		err := relayConfigError(t, "foo: 1\nadmin:\n  adr: x\n")
		wantIn(t, err, `outboxd.yaml:1: unknown key "foo"`, `outboxd.yaml:3: unknown key "adr" in admin`)
	})
}

func TestConfigFileCommandLineWins(t *testing.T) {
	// Not parallel: it sets the environment.
	path := writeConfig(t, `
streams:
  partitions: 3
pages:
  prefetch: 5
destinations:
  - {name: a, url: "http://a.internal/", secret_env: S}
`)
	parse := func(t *testing.T, args ...string) relayFlags {
		t.Helper()
		_, _, f, err := parseRelayFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	t.Run("a flag given on the command line wins over the file", func(t *testing.T) {
		f := parse(t, "--partitions", "5", "--config", path)
		if f.partitions != 5 || f.prefetch != 5 {
			t.Errorf("partitions %d, prefetch %d; want 5 (command line) and 5 (file)", f.partitions, f.prefetch)
		}
	})
	t.Run("a flag given as its default on the command line still wins", func(t *testing.T) {
		if f := parse(t, "--config", path, "--partitions=1"); f.partitions != 1 {
			t.Errorf("partitions %d, want 1", f.partitions)
		}
	})
	t.Run("--destination on the command line replaces the file's destinations", func(t *testing.T) {
		f := parse(t, "--config", path, "--destination", "b=http://b.internal/,secret_env=S")
		if !slices.Equal(f.destinations, []string{"b=http://b.internal/,secret_env=S"}) {
			t.Errorf("destinations %v", f.destinations)
		}
	})
	t.Run("the file wins over OUTBOXD_<FLAG>, which fills what the file leaves out", func(t *testing.T) {
		t.Setenv("OUTBOXD_PARTITIONS", "7")
		t.Setenv("OUTBOXD_BATCH_DOCS", "100")
		if f := parse(t, "--config", path); f.partitions != 3 || f.batchDocs != 100 {
			t.Errorf("partitions %d (want 3, the file's), batch-docs %d (want 100, the environment's)", f.partitions, f.batchDocs)
		}
	})
	t.Run("OUTBOXD_CONFIG names the file when --config is not given", func(t *testing.T) {
		t.Setenv("OUTBOXD_CONFIG", path)
		if f := parse(t); f.partitions != 3 {
			t.Errorf("partitions %d, want the file's 3", f.partitions)
		}
	})
	t.Run("the file's database url wins over DATABASE_URL", func(t *testing.T) {
		t.Setenv("DATABASE_URL", "postgres://env-host/db")
		db, _, _, err := parseRelayFlags([]string{"--config", writeConfig(t, "database:\n  url: postgres://file-host/db\n")})
		if err != nil || db.url != "postgres://file-host/db" {
			t.Errorf("database url %q, %v", db.url, err)
		}
	})
}

func TestConfigFileConnectionSettingsForEveryCommand(t *testing.T) {
	// Not parallel: it sets the environment.
	t.Setenv("ELASTICSEARCH_PASSWORD", "env-password")
	path := writeConfig(t, `
database:
  url: postgres://file-host/db
  schema: from_file
search:
  urls: http://file-es:9200
  password: file-password
admin:
  abandoned_after: 5m
streams:
  partitions: 9
destinations:
  - name: a
    url: ${OUTBOXD_T_NEVER_SET}
    secret_env: S
`)
	t.Run("reconcile takes database and search, and no relay key", func(t *testing.T) {
		fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		db, es := addDBFlags(fs), addESFlags(fs)
		if err := parseFlags(fs, []string{"--config", path}); err != nil {
			t.Fatalf("%v (a variable of a relay-only key must not matter here)", err)
		}
		c, err := es.config()
		if err != nil {
			t.Fatal(err)
		}
		if db.url != "postgres://file-host/db" || db.schema != "from_file" || c.Addresses[0] != "http://file-es:9200" || c.Password != "file-password" {
			t.Errorf("db %q %q, es %v %q", db.url, db.schema, c.Addresses, c.Password)
		}
	})
	t.Run("status keeps its own --abandoned-after", func(t *testing.T) {
		fs := flag.NewFlagSet("status", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		addDBFlags(fs)
		abandoned := fs.Duration("abandoned-after", time.Hour, "")
		if err := parseFlags(fs, []string{"--config", path}); err != nil {
			t.Fatal(err)
		}
		if *abandoned != time.Hour {
			t.Errorf("abandoned-after %v: the relay's admin key reached status", *abandoned)
		}
	})
	t.Run("a command without connection flags has no --config", func(t *testing.T) {
		if err := printVersion([]string{"--config", path}, io.Discard); err == nil {
			t.Error("version accepted --config")
		}
	})
	t.Run("the relay refuses the unset variable its destination needs", func(t *testing.T) {
		_, _, _, err := parseRelayFlags([]string{"--config", path})
		if err == nil || !strings.Contains(err.Error(), "destinations[0].url: environment variable OUTBOXD_T_NEVER_SET is not set") {
			t.Errorf("err = %v", err)
		}
	})
}

// Every relay flag has a key in the file's layout, so the file can hold
// all the relay's settings.
func TestConfigFileHasAKeyForEveryRelayFlag(t *testing.T) {
	t.Parallel()
	keys := map[string]string{"destination": "destinations", "config": "(the file itself)"}
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if name := f.Tag.Get("flag"); name != "" {
				if prev, dup := keys[name]; dup {
					panic("flag " + name + " has two keys: " + prev + " and " + joinKey(path, yamlName(f)))
				}
				keys[name] = joinKey(path, yamlName(f))
			}
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(setting{}) {
				walk(f.Type, joinKey(path, yamlName(f)))
			}
		}
	}
	walk(reflect.TypeOf(fileConfig{}), "")
	fs, _, _, _ := newRelayFlagSet("relay", relayUsage)
	if err := parseFlags(fs, []string{"-config", ""}); err != nil {
		t.Fatal(err)
	}
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := keys[f.Name]; !ok {
			t.Errorf("--%s has no key in the config file's layout (fileConfig)", f.Name)
		}
		delete(keys, f.Name)
	})
	for name, key := range keys {
		t.Errorf("key %s names --%s, which the relay does not have", key, name)
	}
}

// docs/deploy/outboxd.yaml, the documented example, is a file the relay
// takes; so is it with every commented key uncommented, and each of those
// shows the flag's default where the flag has one. It names every relay flag.
func TestConfigExampleFile(t *testing.T) {
	// Not parallel: it sets the environment.
	path := filepath.Join("..", "..", "docs", "deploy", "outboxd.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\$\{(\w+)\}`).FindAllStringSubmatch(string(raw), -1) {
		t.Setenv(m[1], "example-value-of-"+m[1])
	}
	_, _, f, err := parseRelayFlags([]string{"--config", path})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(f.destinations) == 0 {
		t.Error("the example has no destination")
	}
	for _, spec := range f.destinations {
		if _, err := webhook.ParseDestination(spec, func(string) string { return "whsec_c2VjcmV0" }); err != nil {
			t.Errorf("destination %s: %v", spec, err)
		}
	}
	fs, _, _, _ := newRelayFlagSet("relay", relayUsage)
	fs.VisitAll(func(fl *flag.Flag) {
		if fl.Name != "config" && !regexp.MustCompile(`--`+regexp.QuoteMeta(fl.Name)+`(?:[^a-z0-9-]|$)`).Match(raw) {
			t.Errorf("%s does not name --%s", path, fl.Name)
		}
	})

	// "# key: value" lines become "key: value", their indentation kept.
	commented := regexp.MustCompile(`(?m)^(\s*)# (\s*)([a-z_0-9]+:(?: |$))`)
	full := commented.ReplaceAllString(string(raw), "$1$2$3")
	fullPath := filepath.Join(t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(fullPath, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\$\{(\w+)\}`).FindAllStringSubmatch(full, -1) {
		t.Setenv(m[1], "example-value-of-"+m[1])
	}
	fs, _, _, _ = newRelayFlagSet("relay", relayUsage)
	if err := parseFlags(fs, []string{"--config", fullPath}); err != nil {
		t.Fatalf("the example with every key uncommented: %v", err)
	}
	active, err := loadConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	all, err := loadConfigFile(fullPath)
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	for _, k := range fileKeys(active) {
		set[k.path] = true
	}
	shown := 0
	for _, k := range fileKeys(all) {
		fl := fs.Lookup(k.flag)
		if set[k.path] || fl == nil || fl.DefValue == "" {
			continue
		}
		shown++
		if fl.Value.String() != fl.DefValue {
			t.Errorf("the commented %s shows %s, the default of --%s is %s", k.path, fl.Value, k.flag, fl.DefValue)
		}
	}
	if shown < 20 {
		t.Errorf("only %d commented keys with a default", shown)
	}
	spec, err := os.ReadFile(f.indexSpec)
	if err != nil {
		t.Fatalf("index_spec: %v", err)
	}
	if _, err := indexer.IndexBody(spec); err != nil {
		t.Errorf("index_spec %s: %v", f.indexSpec, err)
	}
}
