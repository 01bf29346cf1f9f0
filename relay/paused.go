package relay

// A stream whose sink fails as a whole (an outage, or a configuration the
// sink refuses) makes no progress but loses nothing; operators need to see
// why, in /readyz and on the dashboard, without reading logs.

// setPaused records why stream's sink writes fail, or clears it ("").
func (r *Relay) setPaused(stream, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if reason == "" {
		delete(r.paused, stream)
		return
	}
	if r.paused == nil {
		r.paused = map[string]string{}
	}
	r.paused[stream] = reason
}

// Paused maps each stream this process leads whose sink writes currently
// fail as a whole to the sink's last reason; streams that deliver are
// absent.
func (r *Relay) Paused() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(r.paused))
	for s, reason := range r.paused {
		out[s] = reason
	}
	return out
}
