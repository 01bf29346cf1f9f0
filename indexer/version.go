package indexer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
)

// Supported Elasticsearch versions: 8.0 and later. Older servers lack
// parts of the bulk API the sink relies on (require_alias, the compatible
// error shapes), so the sink refuses them with a ConfigError.
const minMajor = 8

// serverVersion is the oldest Elasticsearch version among the cluster's
// nodes: any node may coordinate a bulk request, so only what the oldest
// accepts may be sent during a rolling upgrade.
type serverVersion struct {
	major, minor int
	number       string
}

// sourceOnErrorParam reports whether bulk accepts include_source_on_error
// (added in 8.18; older servers answer 400 to every bulk that carries it).
func (v serverVersion) sourceOnErrorParam() bool {
	return v.major > 8 || v.major == 8 && v.minor >= 18
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

// detectVersion returns the oldest version among the cluster's nodes.
// GET / is only the fallback, for credentials without the monitor
// privilege: it names just the node that answers (and some distributions
// do not serve it at all).
func detectVersion(ctx context.Context, es esapi.Transport) (serverVersion, error) {
	raw, err := perform(ctx, es, "node versions", esapi.NodesInfoRequest{
		NodeID: []string{"_all"}, Metric: []string{"_none"}, FilterPath: []string{"nodes.*.version"},
	})
	if err != nil {
		var re *ResponseError
		if !errors.As(err, &re) {
			return serverVersion{}, err
		}
		// No monitor privilege: the version of the node that answers GET /.
		var rootErr error
		if raw, rootErr = perform(ctx, es, "server info", esapi.InfoRequest{}); rootErr != nil {
			return serverVersion{}, err
		}
		var info struct {
			Version struct {
				Number string `json:"number"`
			} `json:"version"`
		}
		if err := json.Unmarshal(raw, &info); err != nil || info.Version.Number == "" {
			return serverVersion{}, errors.New("indexer: server info: no version in the answer")
		}
		return parseVersion(info.Version.Number)
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
	switch {
	case errors.As(err, &re) && re.Status == 403:
		// Credentials that may write but not read the version: assume a
		// current server. Should it be older, its 400 to the bulk parameter
		// pauses the relay with a reason that names the parameter.
		s.logger.Warn("indexer: cannot read the Elasticsearch version; assuming 8.18 or later (grant the monitor cluster privilege to detect it)", "error", err.Error())
		v = serverVersion{major: 8, minor: 18, number: "unknown"}
	case notElasticsearch(err):
		return v, &ConfigError{Err: notElasticsearchError(ctx, s.es)}
	case errors.As(err, &re) && re.Status != 408 && re.Status != 429 && re.Status < 500:
		return v, &ConfigError{Err: err}
	case err != nil:
		return v, &UnavailableError{Err: err}
	}
	if v.major < minMajor {
		return v, &ConfigError{Err: fmt.Errorf("Elasticsearch %s is not supported; outboxd needs %d.0 or later", v.number, minMajor)}
	}
	s.ver = v
	return v, nil
}

func (s *Sink) forgetVersion() {
	s.verMu <- struct{}{}
	s.ver = serverVersion{}
	<-s.verMu
}

// notElasticsearch reports the v8 client's refusal of a server that does
// not answer as Elasticsearch (no "X-Elastic-Product: Elasticsearch"
// header), such as OpenSearch. The client does not export that error.
func notElasticsearch(err error) bool {
	return err != nil && strings.Contains(err.Error(), "the server is not Elasticsearch")
}

// notElasticsearchError names the product when GET / says what it is
// (read below the client, whose product check refuses the answer).
func notElasticsearchError(ctx context.Context, es esapi.Transport) error {
	what := "a server that does not answer as Elasticsearch (no X-Elastic-Product: Elasticsearch header)"
	if c, ok := es.(*elasticsearch.Client); ok {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
		if err == nil {
			if res, err := c.Transport.Perform(req); err == nil {
				body, _ := io.ReadAll(io.LimitReader(res.Body, 1<<16))
				res.Body.Close()
				var info struct {
					Version struct {
						Distribution string `json:"distribution"`
						Number       string `json:"number"`
					} `json:"version"`
				}
				if json.Unmarshal(body, &info) == nil && info.Version.Distribution != "" {
					name := info.Version.Distribution
					if name == "opensearch" {
						name = "OpenSearch"
					}
					what = strings.TrimSpace(name + " " + info.Version.Number)
				}
			}
		}
	}
	return fmt.Errorf("the server is %s, not Elasticsearch: outboxd supports Elasticsearch %d.0 and later only (its Elasticsearch client refuses other products, OpenSearch included)", what, minMajor)
}

// CheckServer fails when Elasticsearch answers and is not one outboxd
// supports: another product (OpenSearch), or a version before 8.0. A server
// that does not answer passes: the relay starts, reports the outage and
// writes once it is back. Commands call it at start, so an unsupported
// server is refused before the first event, not at it.
func CheckServer(ctx context.Context, es *elasticsearch.Client) error {
	v, err := detectVersion(ctx, es)
	switch {
	case notElasticsearch(err):
		return notElasticsearchError(ctx, es)
	case err != nil:
		return nil
	case v.major < minMajor:
		return fmt.Errorf("Elasticsearch %s is not supported; outboxd needs %d.0 or later", v.number, minMajor)
	}
	return nil
}
