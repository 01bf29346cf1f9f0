package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// The deploy examples of docs/deploy.md run outboxd check and outboxd
// relay with one config file, and nothing else on the command line. Their
// config files are loaded here as the relay loads them (deploy_config_test.go).

var deployDir = filepath.Join("..", "..", "docs", "deploy")

// docs/deploy.md: the systemd unit is valid (systemd-analyze verify when
// the machine has it), runs check before the relay with the same config
// file, keeps the secrets that file names in the environment file, and
// gives the graceful shutdown the time it needs.
func TestDeploySystemdUnit(t *testing.T) {
	// Not parallel: it sets the environment.
	path := filepath.Join(deployDir, "outboxd-relay.service")
	unit := readUnit(t, path)
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
	pre, start := strings.Fields(unit["Service.ExecStartPre"]), strings.Fields(unit["Service.ExecStart"])
	if len(pre) == 0 || len(start) == 0 || pre[0] != start[0] {
		t.Fatalf("ExecStartPre = %q, ExecStart = %q: want the same binary's check, then its relay", unit["Service.ExecStartPre"], unit["Service.ExecStart"])
	}
	config := configArgs(t, "ExecStartPre", pre[1:], "check")
	if got := configArgs(t, "ExecStart", start[1:], "relay"); got != config {
		t.Errorf("ExecStart's --config %s, ExecStartPre's %s: check must check the relay's file", got, config)
	}

	// The unit's header installs docs/deploy/outboxd.yaml as that file, and
	// relay.env.example as the EnvironmentFile.
	env := envFileNames(t, filepath.Join(deployDir, "relay.env.example"))
	yamlPath := filepath.Join(deployDir, filepath.Base(config))
	sameNames(t, "relay.env.example", env, yamlPath, configVariables(t, yamlPath))
	f := loadDeployConfig(t, yamlPath, env)
	stop, err := time.ParseDuration(unit["Service.TimeoutStopSec"])
	if err != nil {
		t.Fatalf("TimeoutStopSec = %q: %v", unit["Service.TimeoutStopSec"], err)
	}
	if stop < 2*f.shutdown {
		t.Errorf("TimeoutStopSec = %s, want at least twice shutdown_timeout (%s in %s): in-flight writes, then running jobs", stop, f.shutdown, yamlPath)
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
	text := strings.ReplaceAll(string(raw), "="+start[0]+" ", "="+self+" ")
	text = strings.Replace(text, "EnvironmentFile="+unit["Service.EnvironmentFile"], "EnvironmentFile="+filepath.Join(must(filepath.Abs(deployDir)), "relay.env.example"), 1)
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

// docs/deploy.md: the Kubernetes manifests hold a ConfigMap with the
// relay's config file (docs/deploy/outboxd.yaml but for the keys of
// configMapLeavesOut) and the files it names, a Secret with the variables
// it names, a Deployment of several relays that mounts the ConfigMap where
// the file is looked for, takes its environment from the Secret, runs
// outboxd check in an init container, probes /readyz and /healthz on the
// file's admin address and gives the graceful shutdown the time it needs,
// and a PodDisruptionBudget selecting its pods.
func TestDeployKubernetesManifests(t *testing.T) {
	// Not parallel: it sets the environment.
	byKind := readManifests(t, filepath.Join(deployDir, "kubernetes.yaml"))
	cm, secret, dep, pdb := byKind["ConfigMap"], byKind["Secret"], byKind["Deployment"], byKind["PodDisruptionBudget"]
	if cm == nil || secret == nil || dep == nil || pdb == nil {
		t.Fatalf("kinds %v, want a ConfigMap, a Secret, a Deployment and a PodDisruptionBudget", keys(byKind))
	}
	if n, _ := dig(dep, "spec", "replicas").(float64); n < 2 {
		t.Errorf("Deployment replicas = %v, want several relays", n)
	}
	pod := dig(dep, "spec", "template", "spec")
	c, _ := dig(pod, "containers", 0).(map[string]any)
	check, _ := dig(pod, "initContainers", 0).(map[string]any)
	if c == nil || check == nil {
		t.Fatalf("the Deployment's pod has no container or no init container")
	}
	if c["image"] == nil || check["image"] != c["image"] {
		t.Errorf("init container image %v, relay image %v: want the relay's own check", check["image"], c["image"])
	}
	config := configArgs(t, "the init container's args", stringsOf(check["args"]), "check")
	if got := configArgs(t, "the relay container's args", stringsOf(c["args"]), "relay"); got != config {
		t.Errorf("the relay's --config %s, the init container's %s: check must check the relay's file", got, config)
	}

	// The ConfigMap's volume, mounted where --config looks, in both.
	var volume string
	for _, v := range asSlice(dig(pod, "volumes")) {
		if dig(v, "configMap", "name") == dig(cm, "metadata", "name") {
			volume, _ = dig(v, "name").(string)
		}
	}
	if volume == "" {
		t.Fatalf("no volume of the ConfigMap %v in the pod", dig(cm, "metadata", "name"))
	}
	for _, ct := range []map[string]any{check, c} {
		mounted := slices.ContainsFunc(asSlice(ct["volumeMounts"]), func(m any) bool {
			return dig(m, "name") == volume && dig(m, "mountPath") == filepath.Dir(config)
		})
		if !mounted {
			t.Errorf("container %v does not mount the volume %s at %s, where --config %s is", ct["name"], volume, filepath.Dir(config), config)
		}
		if s := dig(ct, "envFrom", 0, "secretRef", "name"); s != dig(secret, "metadata", "name") {
			t.Errorf("container %v: envFrom secretRef = %v, want the Secret %v", ct["name"], s, dig(secret, "metadata", "name"))
		}
	}

	// The ConfigMap's files as the pod sees them, loaded as the relay and
	// check load them, with the Secret's variables only.
	mount := t.TempDir()
	data, _ := cm["data"].(map[string]any)
	for name, text := range data {
		if err := os.WriteFile(filepath.Join(mount, name), []byte(text.(string)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	yamlPath := filepath.Join(mount, filepath.Base(config))
	if data[filepath.Base(config)] == nil {
		t.Fatalf("the ConfigMap has no %s (its keys: %v)", filepath.Base(config), slices.Sorted(maps.Keys(data)))
	}
	vars, _ := dig(secret, "stringData").(map[string]any)
	env := slices.Sorted(maps.Keys(vars))
	sameNames(t, "the Secret", env, "the ConfigMap's "+filepath.Base(config), configVariables(t, yamlPath))
	f := loadDeployConfig(t, yamlPath, env)
	configMapMatchesExample(t, yamlPath, filepath.Join(deployDir, "outboxd.yaml"))

	if p := dig(c, "readinessProbe", "httpGet", "path"); p != "/readyz" {
		t.Errorf("readinessProbe path = %v, want /readyz", p)
	}
	if p := dig(c, "livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("livenessProbe path = %v, want /healthz", p)
	}
	if f.adminToken != "" {
		t.Error("admin.token is set: probes cannot send it, and /readyz answers 401 without it")
	}
	_, port, _ := net.SplitHostPort(f.adminAddr)
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		name := dig(c, probe, "httpGet", "port")
		ok := slices.ContainsFunc(asSlice(c["ports"]), func(p any) bool {
			return dig(p, "name") == name && strconv.Itoa(int(dig(p, "containerPort").(float64))) == port
		})
		if !ok {
			t.Errorf("%s port %v is not a container port %s, the port of admin.addr %s", probe, name, port, f.adminAddr)
		}
	}
	grace, _ := dig(pod, "terminationGracePeriodSeconds").(float64)
	if time.Duration(grace)*time.Second < 2*f.shutdown {
		t.Errorf("terminationGracePeriodSeconds = %v, want at least twice shutdown_timeout (%s)", grace, f.shutdown)
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

// docs/deploy.md names one config path for both: the systemd unit's and
// the Kubernetes pod's relay read the same file.
func TestDeploySameConfigPath(t *testing.T) {
	t.Parallel()
	unit := readUnit(t, filepath.Join(deployDir, "outboxd-relay.service"))
	systemd := configArgs(t, "ExecStart", strings.Fields(unit["Service.ExecStart"])[1:], "relay")
	byKind := readManifests(t, filepath.Join(deployDir, "kubernetes.yaml"))
	k8s := configArgs(t, "the relay container's args", stringsOf(dig(byKind["Deployment"], "spec", "template", "spec", "containers", 0, "args")), "relay")
	if systemd != k8s {
		t.Errorf("the systemd unit reads %s, the Kubernetes relay %s", systemd, k8s)
	}
}

// configArgs checks that args are cmd --config PATH and nothing else (a
// flag would win over the file's key without a word) and returns PATH.
func configArgs(t *testing.T, what string, args []string, cmd string) string {
	t.Helper()
	if len(args) != 3 || args[0] != cmd || args[1] != "--config" || !filepath.IsAbs(args[2]) {
		t.Fatalf("%s: %q, want [%s --config /absolute/path.yaml] and no other flag", what, args, cmd)
	}
	return args[2]
}

// readUnit reads a systemd unit as "Section.Key" -> value.
func readUnit(t *testing.T, path string) map[string]string {
	t.Helper()
	unit := map[string]string{}
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
			if _, dup := unit[section+"."+k]; dup {
				t.Fatalf("%s:%d: %s set twice", path, n, k)
			}
			unit[section+"."+k] = v
		}
	}
	return unit
}

// readManifests reads a multi-document YAML file by kind (one of each),
// with JSON's types (numbers as float64).
func readManifests(t *testing.T, path string) map[string]map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	byKind := map[string]map[string]any{}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var d map[string]any
		if err := json.Unmarshal(must(json.Marshal(doc)), &d); err != nil {
			t.Fatal(err)
		}
		kind, _ := d["kind"].(string)
		if d["apiVersion"] == nil || kind == "" || dig(d, "metadata", "name") == nil {
			t.Fatalf("%s: a document without apiVersion, kind or metadata.name: %v", path, d)
		}
		if byKind[kind] != nil {
			t.Fatalf("%s: two documents of kind %s", path, kind)
		}
		byKind[kind] = d
	}
	return byKind
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
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

func stringsOf(v any) []string {
	var out []string
	for _, a := range asSlice(v) {
		s, _ := a.(string)
		out = append(out, s)
	}
	return out
}

func keys(m map[string]map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
