package indexer

import "testing"

func TestOverPressureLimit(t *testing.T) {
	for _, c := range []struct {
		reason string
		want   bool
	}{
		{"HTTP 429: es_rejected_execution_exception: rejected execution of coordinating operation [coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, coordinating_operation_bytes=52429108, max_coordinating_bytes=33554432]", true},
		// Over the limit only together with what the node already holds:
		// it may pass once the node drains.
		{"HTTP 429: es_rejected_execution_exception: rejected execution of coordinating operation [coordinating_and_primary_bytes=30000000, replica_bytes=0, all_bytes=30000000, coordinating_operation_bytes=5000000, max_coordinating_bytes=33554432]", false},
		// OpenSearch's wording of the same refusal.
		{"HTTP 429: rejected_execution_exception: rejected execution of coordinating operation [coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, coordinating_operation_bytes=35651836, max_coordinating_and_primary_bytes=33554432]", true},
		{"HTTP 429: circuit_breaking_exception: [parent] Data too large", false},
		{"", false},
	} {
		if got := overPressureLimit(c.reason); got != c.want {
			t.Errorf("overPressureLimit(%.80q) = %v, want %v", c.reason, got, c.want)
		}
	}
}
