package indexer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
)

// Supported servers: Elasticsearch 8.0 and later, OpenSearch 2.0 and
// later. Older Elasticsearch lacks parts of the bulk API the sink relies
// on (require_alias, the compatible error shapes); OpenSearch 1.x is past
// its end of life and untested. Others get a ConfigError.
const (
	minMajor           = 8
	minOpenSearchMajor = 2
)

// serverVersion is the product and the oldest version among the cluster's
// nodes: any node may coordinate a bulk request, so only what the oldest
// accepts may be sent during a rolling upgrade.
type serverVersion struct {
	major, minor int
	number       string
	openSearch   bool
}

func (v serverVersion) String() string {
	if v.openSearch {
		return "OpenSearch " + v.number
	}
	return "Elasticsearch " + v.number
}

// sourceOnErrorParam reports whether bulk accepts include_source_on_error
// (Elasticsearch from 8.18; older servers and OpenSearch answer 400 to
// every bulk that carries it).
func (v serverVersion) sourceOnErrorParam() bool {
	return !v.openSearch && (v.major > 8 || v.major == 8 && v.minor >= 18)
}

// unsupported says why outboxd refuses the server, or nil.
func (v serverVersion) unsupported() error {
	switch {
	case v.openSearch && v.major < minOpenSearchMajor:
		return fmt.Errorf("%s is not supported; outboxd needs OpenSearch %d.0 or later", v, minOpenSearchMajor)
	case !v.openSearch && v.major < minMajor:
		return fmt.Errorf("%s is not supported; outboxd needs Elasticsearch %d.0 or later (or OpenSearch %d.0 or later)", v, minMajor, minOpenSearchMajor)
	}
	return nil
}

// parseVersion reads "8.19.14" or "8.18.0-SNAPSHOT".
func parseVersion(s string) (serverVersion, error) {
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return serverVersion{}, fmt.Errorf("version %q: not major.minor.patch", s)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.SplitN(parts[1], "-", 2)[0])
	if err1 != nil || err2 != nil {
		return serverVersion{}, fmt.Errorf("version %q: not major.minor.patch", s)
	}
	return serverVersion{major: major, minor: minor, number: s}, nil
}

// rootInfo is what GET / says: OpenSearch names itself in
// version.distribution; Elasticsearch has no such field (and its
// integ-test distribution does not serve GET / at all).
type rootInfo struct {
	Version struct {
		Distribution string `json:"distribution"`
		Number       string `json:"number"`
	} `json:"version"`
}

// detectVersion returns the product and the oldest version among the
// cluster's nodes. GET / tells the product (and the version, for
// credentials without the monitor privilege, which the node list needs:
// it names just the node that answers).
func detectVersion(ctx context.Context, es esapi.Transport) (serverVersion, error) {
	rootRaw, rootErr := perform(ctx, es, "server info", esapi.InfoRequest{})
	var re *ResponseError
	if rootErr != nil && !errors.As(rootErr, &re) {
		return serverVersion{}, rootErr // no answer
	}
	var root rootInfo
	if rootErr == nil && json.Unmarshal(rootRaw, &root) != nil {
		// A proxy's landing page, say: no product named, and no version
		// to fall back on.
		root, rootErr = rootInfo{}, errors.New("indexer: server info: the answer is not JSON")
	}
	var product string
	switch d := root.Version.Distribution; d {
	case "":
	case "opensearch":
		product = "OpenSearch"
	default:
		return serverVersion{}, &ConfigError{Err: fmt.Errorf("the server is %s %s: outboxd supports Elasticsearch %d.0 and later and OpenSearch %d.0 and later", d, root.Version.Number, minMajor, minOpenSearchMajor)}
	}

	raw, err := perform(ctx, es, "node versions", esapi.NodesInfoRequest{
		NodeID: []string{"_all"}, Metric: []string{"_none"}, FilterPath: []string{"nodes.*.version"},
	})
	if err != nil {
		if !errors.As(err, &re) || rootErr != nil || root.Version.Number == "" {
			return serverVersion{}, err
		}
		// No monitor privilege: the version of the node that answers GET /.
		v, err := parseVersion(root.Version.Number)
		v.openSearch = product == "OpenSearch"
		return v, err
	}
	var r struct {
		Nodes map[string]struct {
			Version string `json:"version"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || len(r.Nodes) == 0 {
		return serverVersion{}, errors.New("indexer: node versions: no version in the answer")
	}
	var oldest serverVersion
	for _, n := range r.Nodes {
		v, err := parseVersion(n.Version)
		if err != nil {
			return serverVersion{}, fmt.Errorf("indexer: node versions: %w", err)
		}
		if oldest.number == "" || v.major < oldest.major || v.major == oldest.major && v.minor < oldest.minor {
			oldest = v
		}
	}
	oldest.openSearch = product == "OpenSearch"
	return oldest, nil
}

// version returns the cluster's version, detected once per Sink; a
// configuration error makes the sink ask again (see forgetVersion), so an
// upgrade or a fixed proxy is picked up without a restart.
func (s *Sink) version(ctx context.Context) (serverVersion, error) {
	// Another Write may be asking a node that does not answer; this one
	// must still return by its own deadline.
	select {
	case s.verMu <- struct{}{}:
	case <-ctx.Done():
		return serverVersion{}, &UnavailableError{Err: fmt.Errorf("indexer: waiting for another write's version request: %w", ctx.Err())}
	}
	defer func() { <-s.verMu }()
	if s.ver.number != "" {
		return s.ver, nil
	}
	v, err := detectVersion(ctx, s.es)
	var re *ResponseError
	var ce *ConfigError
	switch {
	case errors.As(err, &re) && re.Status == 403:
		// Credentials that may write but not read the version: assume a
		// current server. Should it be older, its 400 to the bulk parameter
		// pauses the relay with a reason that names the parameter.
		s.logger.Warn("indexer: cannot read the server's version; assuming Elasticsearch 8.18 or later (grant the monitor cluster privilege to detect it)", "error", err.Error())
		v = serverVersion{major: 8, minor: 18, number: "unknown"}
	case errors.As(err, &ce):
		return v, err
	case errors.As(err, &re) && re.Status != 408 && re.Status != 429 && re.Status < 500:
		return v, &ConfigError{Err: err}
	case err != nil:
		return v, &UnavailableError{Err: err}
	}
	if err := v.unsupported(); err != nil {
		return v, &ConfigError{Err: err}
	}
	s.ver = v
	return v, nil
}

func (s *Sink) forgetVersion() {
	s.verMu <- struct{}{}
	s.ver = serverVersion{}
	<-s.verMu
}

// servers remembers each client's server, for the requests outside the
// sink (copies, scans) whose parameters differ between products. A
// client talks to one cluster for its life; only the sink, which runs
// for the relay's, asks again after a configuration error.
var servers sync.Map // *elasticsearch.Client -> serverVersion

// serverOf returns the product and version of es's cluster, detected on
// first use.
func serverOf(ctx context.Context, es *elasticsearch.Client) (serverVersion, error) {
	if v, ok := servers.Load(es); ok {
		return v.(serverVersion), nil
	}
	v, err := detectVersion(ctx, es)
	var re *ResponseError
	if errors.As(err, &re) && re.Status == 403 {
		// Credentials without the monitor privilege: as the sink does,
		// assume a current Elasticsearch.
		v, err = serverVersion{major: 8, minor: 18, number: "unknown"}, nil
	}
	if err != nil {
		return v, err
	}
	if err := v.unsupported(); err != nil {
		return v, &ConfigError{Err: err}
	}
	servers.Store(es, v)
	return v, nil
}

// Server describes es's cluster, e.g. "OpenSearch 2.19.6", and reports
// whether it is OpenSearch, for the operator tools (repair, rebuild, backfill, reconcile) and
// the commands' logs.
func Server(ctx context.Context, es *elasticsearch.Client) (name string, openSearch bool, err error) {
	v, err := serverOf(ctx, es)
	if err != nil {
		return "", false, err
	}
	return v.String(), v.openSearch, nil
}

// CheckServer fails when the server answers and is not one outboxd
// supports: another product, Elasticsearch before 8.0 or OpenSearch before
// 2.0. A server that does not answer passes: the relay starts, reports the
// outage and writes once it is back. Commands call it at start, so an
// unsupported server is refused before the first event, not at it.
func CheckServer(ctx context.Context, es *elasticsearch.Client) error {
	_, err := serverOf(ctx, es)
	var ce *ConfigError
	if errors.As(err, &ce) {
		return ce.Err
	}
	return nil
}
