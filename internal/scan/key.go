package scan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/outboxd/outboxd/indexer"
)

// Doc is what a tool keeps of one scanned document: its coordinates and
// the few values repair ranks by (reconcile reads its source_id, version
// and tombstone flag), never its source, so a plan over millions of
// documents stays small. Repair re-fetches sources by id for the backup
// and the apply step.
type Doc struct {
	Index       string `json:"index"`
	ID          string `json:"id"`
	ESVersion   int64  `json:"es_version"` // _version
	SeqNo       int64  `json:"seq_no"`
	PrimaryTerm int64  `json:"primary_term"`
	// Version is the business version when Versioned, else _version.
	Version int64 `json:"version"`
	// Versioned: Version is a business version, from the source's version
	// field, or the _version of a document at _id = source_id in the write
	// index, the only place the sink writes (external versions, which the
	// gate compares events with). Elsewhere _version is a legacy writer's
	// internal version: it counts writes (a copy edited 20 times is at 20)
	// and says nothing about business versions.
	Versioned bool   `json:"versioned,omitempty"`
	SourceID  string `json:"source_id"` // the source_id field, else _id: where the document belongs
	Updated   string `json:"updated,omitempty"`
	Tombstone bool   `json:"tombstone,omitempty"`
	// IDSource: there is no source_id field; SourceID is the _id.
	IDSource bool `json:"-"`
}

// Key extracts the grouping key and the ranking values from a hit
// whose source was limited to Fields. ok is false
// when the key is missing: such documents cannot be grouped and are left
// alone (counted as ungroupable).
func Key(h Hit, key []string, versionField, updatedField string) (k string, d Doc, ok bool, err error) {
	var src map[string]any
	if len(h.Source) > 0 {
		dec := json.NewDecoder(bytes.NewReader(h.Source))
		dec.UseNumber()
		if err := dec.Decode(&src); err != nil {
			return "", d, false, fmt.Errorf("document %s/%s: _source: %w", h.Index, h.ID, err)
		}
	}
	d = Doc{Index: h.Index, ID: h.ID, ESVersion: h.Version, SeqNo: h.SeqNo, PrimaryTerm: h.PrimaryTerm, Version: h.Version}
	if b, _ := fieldAt(src, indexer.TombstoneField).(bool); b {
		d.Tombstone = true
	}
	d.SourceID, d.IDSource = h.ID, true
	if s := scalar(fieldAt(src, "source_id")); s != "" {
		d.SourceID, d.IDSource = s, false
	}
	if versionField != "" {
		if n, isNum := fieldAt(src, versionField).(json.Number); isNum {
			if v, err := n.Int64(); err == nil {
				d.Version, d.Versioned = v, true
			}
		}
	}
	if updatedField != "" {
		d.Updated = scalar(fieldAt(src, updatedField))
	}
	parts := make([]string, len(key))
	for i, f := range key {
		var v string
		if f == "source_id" {
			v = d.SourceID // documents written by outboxd have _id = source_id and may lack the field
		} else {
			v = scalar(fieldAt(src, f))
		}
		if v == "" {
			return "", d, false, nil
		}
		parts[i] = v
	}
	if len(parts) == 1 {
		return parts[0], d, true, nil
	}
	b, _ := json.Marshal(parts)
	return string(b), d, true, nil
}

// fieldAt walks a dotted path, accepting both nested objects and
// literal dotted keys.
func fieldAt(src map[string]any, path string) any {
	if src == nil {
		return nil
	}
	if v, ok := src[path]; ok {
		return v
	}
	head, rest, found := strings.Cut(path, ".")
	if !found {
		return nil
	}
	m, _ := src[head].(map[string]any)
	return fieldAt(m, rest)
}

func scalar(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	}
	return ""
}

// Fields is the _source filter for the scan.
func Fields(key []string, versionField, updatedField string) []string {
	seen := map[string]bool{}
	var out []string
	for _, f := range append([]string{"source_id", indexer.TombstoneField, versionField, updatedField}, key...) {
		if f != "" && !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out
}
