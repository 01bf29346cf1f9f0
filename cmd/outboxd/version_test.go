package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionOfABuild(t *testing.T) {
	t.Parallel()
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}}
	}
	for _, c := range []struct {
		name            string
		version, commit string
		bi              *debug.BuildInfo
		want            build
	}{
		{"the stamped version and commit win over the build info", "v1.2.0-3-gabc1234-dirty", "abc1234def", vcs("0000000", "false"),
			build{Version: "v1.2.0-3-gabc1234-dirty", Commit: "abc1234def", Go: "go1.99.1"}},
		{"without stamping the commit is vcs.revision", "", "", vcs("4f5e6d7c", "false"),
			build{Version: "devel", Commit: "4f5e6d7c", Go: "go1.99.1"}},
		{"a modified tree marks the revision dirty", "", "", vcs("4f5e6d7c", "true"),
			build{Version: "devel", Commit: "4f5e6d7c-dirty", Go: "go1.99.1"}},
		{"go install module@version gives the module version", "", "",
			&debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "v1.3.0"}},
			build{Version: "v1.3.0", Commit: "unknown", Go: "go1.99.1"}},
		{"without build info the runtime's Go version stands", "", "", nil,
			build{Version: "devel", Commit: "unknown", Go: runtime.Version()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.want.OS, c.want.Arch = runtime.GOOS, runtime.GOARCH
			if got := buildOf(c.version, c.commit, c.bi); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
	t.Run("outboxd version prints version, commit and Go version on one line", func(t *testing.T) {
		var out bytes.Buffer
		if err := printVersion(nil, &out); err != nil {
			t.Fatal(err)
		}
		if s := out.String(); !strings.HasPrefix(s, "outboxd ") || !strings.Contains(s, "(commit ") || !strings.Contains(s, runtime.Version()) || strings.Count(s, "\n") != 1 {
			t.Errorf("got %q", s)
		}
	})
}

// The binary as make build makes it: -ldflags -X stamps version and
// commit, and both `outboxd version` and `outboxd --version` print them.
func TestVersionStampedAtBuild(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "outboxd")
	ldflags := "-X main.version=v9.8.7-2-g1234abc-dirty -X main.commit=1234abcdef0123456789"
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	want := "outboxd v9.8.7-2-g1234abc-dirty (commit 1234abcdef0123456789, " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(bin, args...).Output()
		if err != nil || string(out) != want {
			t.Errorf("outboxd %s: %v: %q, want %q", args[0], err, out, want)
		}
	}
}

// Without stamping, a go build from a git checkout reports its revision
// (go build records it unless -buildvcs=false). A git worktree gets none
// recorded, so the module's files, as they are now, are committed to a
// repository of their own and built there.
func TestVersionFallsBackToTheVCSRevision(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not found")
	}
	git := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=test", "-c", "user.email=test@localhost", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	top := git(".", "rev-parse", "--show-toplevel")
	src := filepath.Join(t.TempDir(), "src")
	for _, name := range strings.Split(git(top, "ls-files", "--cached", "--others", "--exclude-standard"), "\n") {
		b, err := os.ReadFile(filepath.Join(top, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(src, "init", "--quiet")
	git(src, "add", "-A")
	git(src, "commit", "--quiet", "-m", "snapshot")
	head := git(src, "rev-parse", "HEAD")
	bin := filepath.Join(t.TempDir(), "outboxd")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/outboxd")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(out), "(commit "+head+", ") {
		t.Fatalf("outboxd version: %v: %q, want the commit %s", err, out, head)
	}
}
