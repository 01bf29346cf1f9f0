package documents

import "github.com/prometheus/client_golang/prometheus"

// ReadsCounter and IDsCounter let the tests count reads.
func (s *Sink) ReadsCounter() *prometheus.CounterVec { return s.reads }
func (s *Sink) IDsCounter() *prometheus.CounterVec   { return s.ids }

// TriggerName is the watch triggers' base name, for tests.
var TriggerName = triggerName
