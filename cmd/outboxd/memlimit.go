package main

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryBase is what a relay process needs besides its pages: the runtime,
// connection buffers, metrics, the admin server.
const memoryBase = 32 << 20

// relayMemoryLimit is the soft memory limit (GOMEMLIMIT) outboxd relay sets
// unless the environment sets one: without it the Go heap grows to twice
// what is live before collecting, so the pages a relay holds by design
// would cost twice their size in RSS. "auto" derives it from that design
// bound: per stream, pages read ahead, at the sink and their bulk bodies
// ((prefetch + 2 x in-flight + 1) x the stream's page bytes, pageBytes[i]).
// It is soft: a process that needs more (one giant document) gets it, at
// the price of more frequent collection.
func relayMemoryLimit(spec string, f relayFlags, pageBytes []int) (int64, error) {
	switch strings.ToLower(strings.TrimSpace(spec)) {
	case "auto":
		limit := int64(memoryBase)
		for _, b := range pageBytes {
			limit += int64(f.prefetch+2*f.inFlight+1) * int64(b)
		}
		return limit, nil
	case "off", "0":
		return 0, nil
	}
	n, unit, err := parseBytes(spec)
	if err != nil {
		return 0, fmt.Errorf("memory-limit: %w", err)
	}
	// A bare number was read as bytes: 512 meant 512 MiB, and a limit of
	// 512 bytes makes the runtime collect without pause.
	if !unit {
		return 0, fmt.Errorf("memory-limit: %q has no unit; give one, such as %sMiB (units: B, KiB, MiB, GiB, KB, MB, GB), or auto or off", spec, strings.TrimSpace(spec))
	}
	if n < memoryBase {
		return 0, fmt.Errorf("memory-limit: %q is below the %d MiB the process needs besides its pages; give at least %dMiB, or auto or off", spec, memoryBase>>20, memoryBase>>20)
	}
	return n, nil
}

// parseBytes reads a size such as 512MiB, 2GiB, 300MB or 1048576, and
// reports whether it carried a unit.
func parseBytes(in string) (n int64, unit bool, err error) {
	s := strings.TrimSpace(in)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult, unit = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult, true
			break
		}
	}
	n, err = strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, false, fmt.Errorf("want auto, off, or a size such as 512MiB, got %q", in)
	}
	return n * mult, unit, nil
}

// applyMemoryLimit sets the soft memory limit unless GOMEMLIMIT does.
func applyMemoryLimit(limit int64, log *slog.Logger) {
	if os.Getenv("GOMEMLIMIT") != "" {
		log.Info("memory limit from GOMEMLIMIT", "bytes", debug.SetMemoryLimit(-1))
		return
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
		log.Info("memory limit", "bytes", limit)
	}
}
