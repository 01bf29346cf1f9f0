package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// relayArgsParse checks that args are flags outboxd relay accepts, by
// parsing them and asking for help (which stops before anything connects).
func relayArgsParse(t *testing.T, args []string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	runErr := runRelay(context.Background(), append(append([]string{}, args...), "--help"))
	os.Stderr = stderr
	_ = w.Close()
	_, _ = io.ReadAll(r)
	if !errors.Is(runErr, flag.ErrHelp) {
		t.Fatalf("outboxd relay %s: %v", strings.Join(args, " "), runErr)
	}
}

// shutdownTimeout reads --shutdown-timeout from relay arguments.
func shutdownTimeout(t *testing.T, args []string) time.Duration {
	t.Helper()
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--shutdown-timeout=")
		if !ok && a == "--shutdown-timeout" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("--shutdown-timeout %q: %v", v, err)
			}
			return d
		}
	}
	t.Fatal("no --shutdown-timeout in the relay's arguments")
	return 0
}

// docs/deploy.md: the systemd unit is valid (systemd-analyze verify when
// the machine has it), passes only flags the relay knows, keeps secrets in
// the environment file, and gives the graceful shutdown the time it needs.
func TestDeploySystemdUnit(t *testing.T) {
	// Not parallel: relayArgsParse swaps os.Stderr.
	path := filepath.Join("..", "..", "docs", "deploy", "outboxd-relay.service")
	unit := map[string]string{} // "Section.Key" -> value
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	section := ""
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key=value line in a section: %q", path, n, line)
			}
			unit[section+"."+k] = v
		}
	}
	for k, want := range map[string]string{
		"Service.Restart": "always", "Service.KillSignal": "SIGTERM", "Install.WantedBy": "multi-user.target",
	} {
		if unit[k] != want {
			t.Errorf("%s = %q, want %q", k, unit[k], want)
		}
	}
	if unit["Service.EnvironmentFile"] == "" {
		t.Error("no EnvironmentFile: secrets would have to be on the command line")
	}
	exec0 := strings.Fields(unit["Service.ExecStart"])
	if len(exec0) < 2 || exec0[1] != "relay" {
		t.Fatalf("ExecStart = %q, want outboxd relay ...", unit["Service.ExecStart"])
	}
	if regexp.MustCompile(`://[^/\s]*@|password|api.key|token`).MatchString(strings.ToLower(unit["Service.ExecStart"])) {
		t.Errorf("ExecStart carries a secret (everyone can read it in /proc): %q", unit["Service.ExecStart"])
	}
	relayArgsParse(t, exec0[2:])
	stop, err := time.ParseDuration(unit["Service.TimeoutStopSec"])
	if err != nil {
		t.Fatalf("TimeoutStopSec = %q: %v", unit["Service.TimeoutStopSec"], err)
	}
	if grace := shutdownTimeout(t, exec0[2:]); stop < 2*grace {
		t.Errorf("TimeoutStopSec = %s, want at least twice --shutdown-timeout (%s): in-flight writes, then running jobs", stop, grace)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not found: the unit was checked structurally only")
		return
	}
	// verify wants the binary and the environment file to exist: point them
	// at this test's executable and the example file.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(raw), "ExecStart="+exec0[0], "ExecStart="+self, 1)
	text = strings.Replace(text, "EnvironmentFile="+unit["Service.EnvironmentFile"], "EnvironmentFile="+filepath.Join(must(filepath.Abs(filepath.Dir(path))), "relay.env.example"), 1)
	copyPath := filepath.Join(t.TempDir(), "outboxd-relay.service")
	if err := os.WriteFile(copyPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// verify exits 0 on unknown keys and bad values: any output is a finding.
	out, err := exec.Command(analyze, "verify", copyPath).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// docs/deploy.md: the Kubernetes manifests hold a Secret, a Deployment of
// several relays with readiness on /readyz and liveness on /healthz, its
// secrets from that Secret, a grace period for the graceful shutdown, and
// a PodDisruptionBudget selecting its pods. The YAML is parsed with
// python3's yaml module when the machine has it (no Go YAML dependency);
// otherwise a structural check of the text stands in.
func TestDeployKubernetesManifests(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "deploy", "kubernetes.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	docs := structuralYAML(t, string(raw))
	if py, err := exec.LookPath("python3"); err == nil && exec.Command(py, "-c", "import yaml").Run() == nil {
		out, err := exec.Command(py, "-c", `import json, sys, yaml; json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)`, path).Output()
		if err != nil {
			t.Fatalf("python3 yaml.safe_load_all %s: %v", path, err)
		}
		if err := json.Unmarshal(out, &docs); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Log("python3 with yaml not found: the manifests were checked structurally only")
	}
	byKind := map[string]map[string]any{}
	for _, d := range docs {
		kind, _ := d["kind"].(string)
		if d["apiVersion"] == nil || kind == "" || dig(d, "metadata", "name") == nil {
			t.Fatalf("a document without apiVersion, kind or metadata.name: %v", d)
		}
		byKind[kind] = d
	}
	dep, pdb, secret := byKind["Deployment"], byKind["PodDisruptionBudget"], byKind["Secret"]
	if dep == nil || pdb == nil || secret == nil {
		t.Fatalf("kinds %v, want a Deployment, a PodDisruptionBudget and a Secret", keys(byKind))
	}
	if n, _ := dig(dep, "spec", "replicas").(float64); n < 2 {
		t.Errorf("Deployment replicas = %v, want several relays", n)
	}
	c, _ := dig(dep, "spec", "template", "spec", "containers", 0).(map[string]any)
	if p := dig(c, "readinessProbe", "httpGet", "path"); p != "/readyz" {
		t.Errorf("readinessProbe path = %v, want /readyz", p)
	}
	if p := dig(c, "livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("livenessProbe path = %v, want /healthz", p)
	}
	if s := dig(c, "envFrom", 0, "secretRef", "name"); s != dig(secret, "metadata", "name") {
		t.Errorf("envFrom secretRef = %v, want the Secret %v", s, dig(secret, "metadata", "name"))
	}
	var args []string
	for _, a := range asSlice(c["args"]) {
		s, _ := a.(string)
		args = append(args, s)
	}
	if len(args) == 0 || args[0] != "relay" {
		t.Fatalf("container args %v, want relay ...", args)
	}
	relayArgsParse(t, args[1:])
	grace, _ := dig(dep, "spec", "template", "spec", "terminationGracePeriodSeconds").(float64)
	if st := shutdownTimeout(t, args[1:]); time.Duration(grace)*time.Second < 2*st {
		t.Errorf("terminationGracePeriodSeconds = %v, want at least twice --shutdown-timeout (%s)", grace, st)
	}
	want, _ := json.Marshal(dig(dep, "spec", "selector", "matchLabels"))
	got, _ := json.Marshal(dig(pdb, "spec", "selector", "matchLabels"))
	if string(got) != string(want) || string(got) == "null" {
		t.Errorf("PodDisruptionBudget selects %s, the Deployment's pods are %s", got, want)
	}
	if dig(pdb, "spec", "minAvailable") == nil && dig(pdb, "spec", "maxUnavailable") == nil {
		t.Error("PodDisruptionBudget has neither minAvailable nor maxUnavailable")
	}
}

// structuralYAML checks the text of a multi-document YAML file (no tabs,
// indentation in steps of two) and reads it with parseBlock, which knows
// only the subset the manifests use; on them it gives the same tree as
// python3's yaml.safe_load_all.
func structuralYAML(t *testing.T, text string) []map[string]any {
	t.Helper()
	var docs []map[string]any
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
		var lines []string
		for n, l := range strings.Split(doc, "\n") {
			if strings.Contains(l, "\t") {
				t.Fatalf("document %d line %d: a tab in YAML indentation", i+1, n+1)
			}
			if s := strings.TrimSpace(l); s == "" || strings.HasPrefix(s, "#") {
				continue
			}
			if ind := len(l) - len(strings.TrimLeft(l, " ")); ind%2 != 0 {
				t.Fatalf("document %d line %d: indentation of %d spaces, not a multiple of 2: %q", i+1, n+1, ind, l)
			}
			lines = append(lines, l)
		}
		if len(lines) == 0 {
			continue
		}
		tree, _ := parseBlock(lines)
		m, ok := tree.(map[string]any)
		if !ok {
			t.Fatalf("document %d is not a mapping", i+1)
		}
		docs = append(docs, m)
	}
	return docs
}

// parseBlock reads block mappings, "- " sequences, plain and double-quoted
// scalars and flow lists of scalars, starting at lines[0]; it returns the
// value and the number of lines consumed.
func parseBlock(lines []string) (any, int) {
	indent := func(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }
	base := indent(lines[0])
	if strings.HasPrefix(strings.TrimSpace(lines[0]), "- ") || strings.TrimSpace(lines[0]) == "-" {
		var seq []any
		i := 0
		for i < len(lines) && indent(lines[i]) == base && strings.HasPrefix(strings.TrimSpace(lines[i]), "-") {
			rest := strings.TrimPrefix(strings.TrimSpace(lines[i]), "-")
			rest = strings.TrimPrefix(rest, " ")
			// The item's own lines: this one (as if indented past "- ") and
			// the deeper ones after it.
			j := i + 1
			for j < len(lines) && indent(lines[j]) > base {
				j++
			}
			if strings.Contains(rest, ": ") || strings.HasSuffix(rest, ":") {
				item := append([]string{strings.Repeat(" ", base+2) + rest}, lines[i+1:j]...)
				v, _ := parseBlock(item)
				seq = append(seq, v)
			} else {
				seq = append(seq, scalar(rest))
			}
			i = j
		}
		return seq, i
	}
	m := map[string]any{}
	i := 0
	for i < len(lines) && indent(lines[i]) == base {
		k, v, _ := strings.Cut(strings.TrimSpace(lines[i]), ":")
		v = strings.TrimSpace(v)
		j := i + 1
		for j < len(lines) && (indent(lines[j]) > base || indent(lines[j]) == base && strings.HasPrefix(strings.TrimSpace(lines[j]), "- ") && v == "") {
			j++
		}
		if v == "" && j > i+1 {
			m[k], _ = parseBlock(lines[i+1 : j])
		} else {
			m[k] = scalar(v)
		}
		i = j
	}
	return m, i
}

func scalar(s string) any {
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		var out []any
		for _, p := range strings.Split(strings.Trim(s, "[]"), ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, scalar(p))
			}
		}
		return out
	}
	if uq, err := strconv.Unquote(s); err == nil {
		return uq
	}
	if s == "true" || s == "false" {
		return s == "true"
	}
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		return n
	}
	return s
}

func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			s := asSlice(v)
			if k >= len(s) {
				return nil
			}
			v = s[k]
		}
	}
	return v
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func keys(m map[string]map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
