package main

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/schema/schematest"
)

// outboxd's sessions run without JIT compilation, which cost more than
// any of its statements (the stats query over a large outbox: 18-150 ms
// compiled, 0.06 ms run); a URL that sets jit keeps its own.
func TestPoolsRunWithoutJIT(t *testing.T) {
	t.Parallel()
	url := schematest.DatabaseURL(t)
	type jitCase struct{ name, url, want string }
	cases := []jitCase{{"the URL as given", url, "off"}}
	if strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://") {
		cases = append(cases, jitCase{"the URL with jit=on", withParam(url, "jit=on"), "on"})
	}
	for _, tc := range cases {
		f := &dbFlags{url: tc.url, schema: "outbox"}
		pool, err := f.pool(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var jit string
		err = pool.QueryRow(context.Background(), `SHOW jit`).Scan(&jit)
		pool.Close()
		if err != nil {
			t.Fatal(err)
		}
		if jit != tc.want {
			t.Errorf("%s: jit = %s, want %s", tc.name, jit, tc.want)
		}
	}
}
