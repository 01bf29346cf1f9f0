package main

import (
	"strings"
	"testing"
)

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	sel, err := c.selected()
	if err != nil {
		t.Fatal(err)
	}
	if len(sel) != len(scenarioNames) {
		t.Errorf("all selects %d scenarios, want %d", len(sel), len(scenarioNames))
	}
}

func TestParseConfigDocuments(t *testing.T) {
	c, err := parseConfig([]string{"-scenarios", "documents"})
	if err != nil {
		t.Fatal(err)
	}
	sel, err := c.selected()
	if err != nil {
		t.Fatal(err)
	}
	if !sel["documents"] || len(sel) != 1 {
		t.Errorf("-scenarios documents selects %v", sel)
	}
	if c.documentsN != 100_000 || c.documentsFanout != 10_000 || c.documentsChildren != 5 {
		t.Errorf("documents defaults: n %d, fan-out %d, children %d", c.documentsN, c.documentsFanout, c.documentsChildren)
	}
	if _, err := parseConfig([]string{"-documents-n", "10", "-documents-fanout", "11"}); err == nil {
		t.Error("a fan-out above documents-n was accepted")
	}
}

func TestRelayArgsShownHidesPasswords(t *testing.T) {
	got := relayArgsShown("--database-url postgres://u:s3cret@127.0.0.1:5432/db?sslmode=disable --in-flight 2")
	if strings.Contains(got, "s3cret") || !strings.Contains(got, "--in-flight 2") || !strings.Contains(got, "postgres://u:xxxxx@127.0.0.1:5432/db") {
		t.Fatalf("shown %q", got)
	}
}
