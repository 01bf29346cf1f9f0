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
