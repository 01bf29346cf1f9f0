package repair

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// AuditEntry is one line of the audit log.
type AuditEntry struct {
	Time     time.Time `json:"time"`
	Operator string    `json:"operator"`
	Action   string    `json:"action"` // e.g. repair.start, repair.group, repair.finish, repair.restore
	Index    string    `json:"index,omitempty"`
	Key      string    `json:"key,omitempty"`
	IDs      []string  `json:"ids,omitempty"` // index/_id of every document the action touched
	Reason   string    `json:"reason,omitempty"`
	Outcome  string    `json:"outcome,omitempty"`
	Detail   any       `json:"detail,omitempty"`
}

// AuditLog appends JSON lines to a file opened for append only, so
// several runs share one log and nothing earlier is ever rewritten.
type AuditLog struct {
	mu       sync.Mutex
	f        *os.File
	operator string
}

// OpenAuditLog opens (creating if needed) the audit log at path. An empty
// path gives a nil log whose methods do nothing.
func OpenAuditLog(path, operator string) (*AuditLog, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("indexer: audit log: %w", err)
	}
	return &AuditLog{f: f, operator: operator}, nil
}

// Append writes one entry, filling Time and Operator.
func (a *AuditLog) Append(e AuditEntry) error {
	if a == nil {
		return nil
	}
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	if e.Operator == "" {
		e.Operator = a.operator
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("indexer: audit log: %w", err)
	}
	return nil
}

// Sync flushes the log to disk.
func (a *AuditLog) Sync() error {
	if a == nil {
		return nil
	}
	return a.f.Sync()
}

// Close syncs and closes the log.
func (a *AuditLog) Close() error {
	if a == nil {
		return nil
	}
	serr := a.f.Sync()
	if err := a.f.Close(); err != nil {
		return err
	}
	return serr
}
