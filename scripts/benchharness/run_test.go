package main

import "testing"

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
