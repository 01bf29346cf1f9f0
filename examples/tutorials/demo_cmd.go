package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

func init() {
	register("demo", "play a retrying, double-clicking client against the API and wait for search to converge", runDemoClient)
}

func runDemoClient(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	api := fs.String("api", "http://127.0.0.1:8080", "example API base URL (or $OUTBOXD_API_URL)")
	user := fs.String("user", "demo-user", "X-User-ID to write as")
	count := fs.Int("count", 20, "tutorials to create")
	burst := fs.Int("burst", 20, "concurrent duplicate submits of one key")
	wait := fs.Duration("wait", 2*time.Minute, "how long search may take to converge")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return RunDemo(ctx, DemoOptions{
		BaseURL: *api, Out: redactWriter{os.Stdout}, User: *user, Count: *count, Burst: *burst, Wait: *wait,
	})
}
