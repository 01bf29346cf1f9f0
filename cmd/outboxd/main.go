// Command outboxd keeps Elasticsearch in step with a PostgreSQL outbox.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand; each lives in its own file and registers
// itself from init, so adding one never touches this file.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string) error) {
	commands[name] = command{name: name, summary: summary, run: run}
}

// exitError carries a specific exit code (e.g. status's threshold breach).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func main() {
	// Logs and errors pass through the redactor (parseFlags fills it): a
	// library's error may quote a connection string.
	stderr := redactWriter{w: os.Stderr, r: secrets}
	slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel()})))
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	if os.Args[1] == "--version" || os.Args[1] == "-version" {
		fmt.Println(currentBuild())
		return
	}
	governScheduler = true
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "outboxd: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}

	// First signal: cancel the context and let the command shut down
	// gracefully. Second signal: exit at once.
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		slog.Info("signal received, shutting down; send again to exit at once", "signal", s.String())
		cancel()
		<-sig
		slog.Warn("second signal, exiting now")
		os.Exit(1)
	}()

	err := cmd.run(ctx, os.Args[2:])
	cancel()
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "outboxd %s: %v\n", cmd.name, ee.err)
		}
		os.Exit(ee.code)
	}
	fmt.Fprintf(stderr, "outboxd %s: %v\n", cmd.name, err)
	os.Exit(1)
}

func usage() {
	fmt.Fprintln(os.Stderr, "Usage: outboxd <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-17s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'outboxd <command> --help' for a command's flags, 'outboxd --version' for the build.")
}

func logLevel() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(os.Getenv("OUTBOXD_LOG_LEVEL"))); err != nil {
		return slog.LevelInfo
	}
	return l
}
