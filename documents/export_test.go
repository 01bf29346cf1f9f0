package documents

import "github.com/prometheus/client_golang/prometheus"

// ReadsCounter and IDsCounter let the tests count reads.
func (s *Sink) ReadsCounter() *prometheus.CounterVec { return s.reads }
func (s *Sink) IDsCounter() *prometheus.CounterVec   { return s.ids }

// TriggerName is the watch triggers' base name, for tests.
var TriggerName = triggerName

// SkipKeyFormRule turns off the refusal of keys whose form the trigger's
// $1 rewrite cannot handle, so that a test reaches the run of the
// trigger's statement at watch time; the returned func turns it back on.
func SkipKeyFormRule() func() {
	skipKeyFormRule = true
	return func() { skipKeyFormRule = false }
}
