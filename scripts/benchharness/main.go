// Command benchharness measures the relay, the Elasticsearch sink and
// `outboxd backfill` (run as a child process from -outboxd, by default
// outboxd next to this executable) against baselines run in the same
// process on the same machine: it prints numbers and ratios, never
// pass/fail except the [met]/[MISSED] marks of the project's goals. scripts/bench is its entry point; docs/benchmarks.md
// records a run.
//
// Usage:
//
//	benchharness run [flags]        run the selected scenarios and print a report
//	benchharness relay-child [...]  internal: drain one backlog with a no-op sink
//	                                and print the result as JSON (RSS is measured
//	                                in this child so the harness's own memory
//	                                does not count)
//
// The lowrate, idle, memory and shutdown scenarios measure what a
// deployment costs, so they run the real `outboxd relay` binary as a child
// instead, behind a proxy that sees Elasticsearch's answers (esproxy.go).
//
// Every schema and index it creates has a unique bench_/bench- name and is
// dropped at the end, also after a failure or an interrupt.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	args := os.Args[1:]
	cmd := "run"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "run":
		err = run(ctx, args)
	case "relay-child":
		err = relayChild(ctx, args)
	default:
		err = fmt.Errorf("unknown command %q (want run or relay-child)", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchharness:", err)
		os.Exit(1)
	}
}
