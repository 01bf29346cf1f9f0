package outbox

// Status is a sink's verdict on one event.
type Status int

const (
	// Applied: the sink now holds this event's version.
	Applied Status = iota + 1
	// Stale: the sink already holds this version or a newer one. A normal,
	// counted outcome of replays, duplicates and reordering.
	Stale
	// Retry: a transient failure (timeout, 429, 5xx); the relay tries again
	// with backoff and dead-letters the event past its attempt limit.
	Retry
	// Rejected: the sink will never accept this event as it is; the relay
	// parks it in dead_letters with Reason and moves on.
	Rejected
)

func (s Status) String() string {
	switch s {
	case Applied:
		return "applied"
	case Stale:
		return "stale"
	case Retry:
		return "retry"
	case Rejected:
		return "rejected"
	}
	return "unknown"
}

// Outcome is the sink's answer for the event at the same position of the
// batch given to Write.
type Outcome struct {
	Status Status
	Reason string // why, for Retry and Rejected
	// Outage marks a Retry that is the sink's fault, not the event's (the
	// cluster answers 503 or 429 to every request, not only to the one
	// holding this event; a connection that failed while other requests
	// of the same Write got through): the relay retries it with backoff
	// without limit, never charging the event's attempts. A failure that
	// recurs only for this event must not carry Outage, or its stream
	// would stall behind it.
	Outage bool
}
