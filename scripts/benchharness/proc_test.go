package main

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schema/schematest"
)

// The meter must find a process's PostgreSQL backends and charge it their
// CPU: here the process is the test itself.
func TestCPUMeterChargesBackends(t *testing.T) {
	pool := schematest.Pool(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		t.Fatal(err)
	}
	m := newCPUMeter(os.Getpid(), pool)
	if got := m.backends(ctx); !slices.Contains(got, backend) {
		t.Fatalf("backends of this process = %v, want them to include %d", got, backend)
	}
	m.begin(ctx)
	var n int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM generate_series(1, 5000000)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	_, pg, _ := m.end(ctx)
	if pg < 50*time.Millisecond {
		t.Fatalf("backend CPU charged = %v for a query that counts to 5 million, want >= 50ms", pg)
	}
}
