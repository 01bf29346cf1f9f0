package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

func init() {
	register("version", "print the version, commit and Go version this binary was built with", runVersion)
}

// version and commit are stamped by `make build`:
//
//	-ldflags "-X main.version=$(git describe --always --dirty) -X main.commit=$(git rev-parse HEAD)"
//
// A binary built without them (go build, go install) falls back on what
// the Go toolchain recorded: the module version and vcs.revision.
var (
	version string
	commit  string
)

// build is what `outboxd version` reports.
type build struct {
	Version string // e.g. v1.2.0-3-gabc1234-dirty; "devel" when unknown
	Commit  string // the full revision, "-dirty" when the tree had changes; "unknown"
	Go      string // e.g. go1.26.8
	OS      string
	Arch    string
}

func (b build) String() string {
	return fmt.Sprintf("outboxd %s (commit %s, %s %s/%s)", b.Version, b.Commit, b.Go, b.OS, b.Arch)
}

func currentBuild() build {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return buildOf(version, commit, bi)
}

// buildOf prefers the stamped values; without them it reads the build
// info: the main module's version (set by go install module@version, and
// by go build from a tagged checkout) and the VCS settings go build
// records unless -buildvcs=false.
func buildOf(stampedVersion, stampedCommit string, bi *debug.BuildInfo) build {
	b := build{Version: stampedVersion, Commit: stampedCommit, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if bi != nil {
		if bi.GoVersion != "" {
			b.Go = bi.GoVersion
		}
		if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
		if b.Commit == "" {
			var revision, modified string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					revision = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if revision != "" {
				b.Commit = revision
				if modified == "true" {
					b.Commit += "-dirty"
				}
			}
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

func runVersion(ctx context.Context, args []string) error { return printVersion(args, os.Stdout) }

func printVersion(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: outboxd version (or outboxd --version)\n\nPrints the version, the commit and the Go version of this binary.")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (version takes none)", fs.Arg(0))
	}
	_, err := fmt.Fprintln(out, currentBuild())
	return err
}
