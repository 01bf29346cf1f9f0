package main

import (
	"strings"
	"testing"
)

func TestRelayMemoryLimitRefusesBareNumbersAndTinyLimits(t *testing.T) {
	t.Parallel()
	f := relayFlags{prefetch: 2, inFlight: 3, batchBytes: 4 << 20}
	for _, tc := range []struct {
		spec string
		want int64
		err  string // part of the error; empty: accepted
	}{
		{"512", 0, "has no unit"},
		{"536870912", 0, "has no unit"},
		{"512MiB", 512 << 20, ""},
		{"1GiB", 1 << 30, ""},
		{"32MiB", 32 << 20, ""},
		{"31MiB", 0, "below the 32 MiB"},
		{"512B", 0, "below the 32 MiB"},
		{"1KiB", 0, "below the 32 MiB"},
		{"off", 0, ""},
		{"0", 0, ""},
		{"lots", 0, "want auto, off, or a size"},
		{"99999999999GiB", 0, "want auto, off, or a size"},
	} {
		got, err := relayMemoryLimit(tc.spec, f, []int{f.batchBytes})
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("--memory-limit %s: %v", tc.spec, err)
		case tc.err == "" && got != tc.want:
			t.Errorf("--memory-limit %s = %d, want %d", tc.spec, got, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.HasPrefix(err.Error(), "memory-limit: ")):
			t.Errorf("--memory-limit %s: error %v, want one naming the flag and %q", tc.spec, err, tc.err)
		}
	}
	if _, _, _, err := parseRelayFlags([]string{"--memory-limit", "512"}); err == nil || !strings.Contains(err.Error(), "memory-limit") {
		t.Fatalf("outboxd relay --memory-limit 512: %v, want refused naming the flag", err)
	}
	// A page of no bytes would leave auto at 32 MiB while pages took the
	// 4 MiB default.
	if _, _, _, err := parseRelayFlags([]string{"--batch-bytes", "0"}); err == nil || !strings.HasPrefix(err.Error(), "batch-bytes: ") {
		t.Fatalf("outboxd relay --batch-bytes 0: %v, want refused naming the flag", err)
	}
}
