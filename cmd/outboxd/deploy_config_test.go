package main

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// configMapLeavesOut are the keys of docs/deploy/outboxd.yaml that the
// Kubernetes ConfigMap's outboxd.yaml does without, and why. Every other
// key the ConfigMap has, with the example's value (comments aside): one
// example to keep up to date, so a change to it that the ConfigMap does
// not follow fails TestDeployKubernetesManifests, and the ConfigMap shows
// no setting the example does not document.
var configMapLeavesOut = map[string]string{
	"admin.token":    "Kubernetes probes cannot send a header taken from a Secret, and with a token /readyz answers 401",
	"search.ca_cert": "its PEM file would have to be in the ConfigMap too; a private CA adds both",
}

// loadDeployConfig loads the config file at path as outboxd relay and
// outboxd check load it, in the environment of a deployed relay: only the
// variables env (a Secret's or EnvironmentFile's names) set, to dummies.
// It then runs what the relay checks before it connects: the settings'
// values, the PostgreSQL URL, the search settings, and the start checks
// that need no server (preflight.beforeConnecting: destinations and their
// secrets, the index spec's file, the admin address). Every error fails
// the test. It returns the relay's settings.
func loadDeployConfig(t *testing.T, path string, env []string) relayFlags {
	t.Helper()
	deployEnv(t, env)
	var f relayFlags
	for _, cmd := range []string{"check", "relay"} {
		db, es, got, err := parseRelayFlagSet(cmd, relayUsage, []string{"--config", path})
		if err != nil {
			t.Fatalf("outboxd %s --config %s: %v", cmd, path, err)
		}
		if _, err := db.poolConfig(); err != nil {
			t.Errorf("outboxd %s --config %s: %v", cmd, path, err)
		}
		if _, err := es.config(); err != nil {
			t.Errorf("outboxd %s --config %s: %v", cmd, path, err)
		}
		p := &preflight{db: db, es: es, f: got}
		if host, _, err := net.SplitHostPort(got.adminAddr); err == nil {
			// Port 0: the host and the admin hosts are checked; whether
			// this machine has the port free says nothing about the file.
			p.f.adminAddr = net.JoinHostPort(host, "0")
		}
		for _, fd := range p.beforeConnecting(context.Background()) {
			if fd.problem() {
				t.Errorf("outboxd %s --config %s: start check: %s: %v", cmd, path, fd.item, fd.err)
			}
		}
		f = got
	}
	return f
}

// deployEnv gives the test a deployed relay's environment: the variables
// names, each set to a dummy value, and none of the others outboxd reads
// (DATABASE_URL, ELASTICSEARCH_*, OUTBOXD_*, AWS_*, and the secret
// variables of the examples), which the test's own environment may hold.
// t.Setenv restores them after the test.
func deployEnv(t *testing.T, names []string) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "DATABASE_URL" || strings.HasSuffix(k, "_SECRET") || strings.HasSuffix(k, "_SECRET_OLD") ||
			strings.HasPrefix(k, "ELASTICSEARCH_") || strings.HasPrefix(k, "OUTBOXD_") || strings.HasPrefix(k, "AWS_") {
			t.Setenv(k, "")
			if err := os.Unsetenv(k); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, n := range names {
		v := "dummy-value-of-" + n
		if n == "DATABASE_URL" {
			v = "postgres://outboxd:dummy@db1.invalid:5432,db2.invalid:5432/app?sslmode=verify-full&target_session_attrs=read-write"
		}
		t.Setenv(n, v)
	}
}

// configVariables lists, sorted, the environment variables the config
// file at path names: each ${VAR} of its values, and the variables its
// destinations take their secrets from (secret_env, previous_secret_env).
func configVariables(t *testing.T, path string) []string {
	t.Helper()
	c, err := loadConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	lookup := func(name string) (string, bool) { names[name] = true; return "", true }
	ks := fileKeys(c)
	for i, d := range c.Destinations {
		ks = append(ks, destinationKeys(d, i)...)
	}
	for _, k := range ks {
		items := []*yaml.Node{k.node}
		if k.node.Kind == yaml.SequenceNode {
			items = k.node.Content
		}
		for _, it := range items {
			v, _, _, err := expandVars(it.Value, lookup)
			if err != nil {
				t.Fatalf("%s:%d: %s: %v", path, it.Line, k.path, err)
			}
			if strings.HasSuffix(k.path, ".secret_env") || strings.HasSuffix(k.path, ".previous_secret_env") {
				names[v] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(names))
}

// envFileNames lists, sorted, the variables a systemd EnvironmentFile sets.
func envFileNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, _, ok := strings.Cut(line, "=")
		if !ok || !isVarName(k) {
			t.Fatalf("%s:%d: not a VARIABLE=value line", path, n)
		}
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// sameNames checks that the variables a Secret or EnvironmentFile sets are
// the ones the config file names: one it lacks stops the relay, and one
// the file does not name is a secret kept for nothing (or a setting the
// file's own key overrides).
func sameNames(t *testing.T, envWhat string, env []string, yamlWhat string, named []string) {
	t.Helper()
	for _, n := range named {
		if !slices.Contains(env, n) {
			t.Errorf("%s names %s, which %s does not set", yamlWhat, n, envWhat)
		}
	}
	for _, n := range env {
		if !slices.Contains(named, n) {
			t.Errorf("%s sets %s, which %s does not name", envWhat, n, yamlWhat)
		}
	}
}

// configMapMatchesExample checks that the settings of the ConfigMap's
// file are the example's but for configMapLeavesOut.
func configMapMatchesExample(t *testing.T, configMap, example string) {
	t.Helper()
	read := func(path string) map[string]any {
		var m map[string]any
		if err := yaml.Unmarshal(must(os.ReadFile(path)), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return m
	}
	got, want := read(configMap), read(example)
	for _, key := range slices.Sorted(maps.Keys(configMapLeavesOut)) {
		parts := strings.Split(key, ".")
		sec, _ := dig(want, stringsAsAny(parts[:len(parts)-1])...).(map[string]any)
		if _, ok := sec[parts[len(parts)-1]]; !ok {
			t.Errorf("configMapLeavesOut names %s, which %s does not set", key, example)
		}
		delete(sec, parts[len(parts)-1])
	}
	for _, d := range diffSettings("", got, want) {
		t.Errorf("the ConfigMap's outboxd.yaml differs from %s (leaving out only %v): %s", example, slices.Sorted(maps.Keys(configMapLeavesOut)), d)
	}
}

// diffSettings lists the keys whose values differ between two decoded
// YAML trees, each as "key: got X, want Y".
func diffSettings(path string, got, want any) []string {
	if gl, ok := got.([]any); ok {
		if wl, ok := want.([]any); ok && len(gl) == len(wl) {
			var out []string
			for i := range gl {
				out = append(out, diffSettings(fmt.Sprintf("%s[%d]", path, i), gl[i], wl[i])...)
			}
			return out
		}
	}
	g, gok := got.(map[string]any)
	w, wok := want.(map[string]any)
	if !gok || !wok {
		if reflect.DeepEqual(got, want) {
			return nil
		}
		return []string{fmt.Sprintf("%s: got %v, want %v", path, got, want)}
	}
	var out []string
	all := maps.Clone(w)
	maps.Copy(all, g)
	for _, k := range slices.Sorted(maps.Keys(all)) {
		out = append(out, diffSettings(joinKey(path, k), g[k], w[k])...)
	}
	return out
}

func stringsAsAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
