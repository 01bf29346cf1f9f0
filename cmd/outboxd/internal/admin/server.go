package admin

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/rebuild"
	"github.com/outboxd/outboxd/relay"
)

// DefaultAddr is loopback: the admin server exposes operational detail and
// the retry controls' data, so reaching it from elsewhere is a choice.
const DefaultAddr = "127.0.0.1:9464"

// Config configures the admin server. Only Gatherer and Stats are needed
// for a useful page; everything else is optional.
type Config struct {
	Addr  string // default DefaultAddr
	Token string // optional; see the package doc
	// Hosts are extra names (or host:port pairs) accepted in the Host
	// header of a server without a Token, besides its own address; see
	// the package doc.
	Hosts    []string
	Gatherer prometheus.Gatherer
	Stats    func(ctx context.Context) (*relay.Stats, error)
	// Ready checks by name, e.g. "postgres" and "elasticsearch".
	Ready map[string]func(ctx context.Context) error
	// Role reports, for each stream this process may lead, whether it
	// leads it now. See RoleOf.
	Role   func() map[string]bool
	Jobs   func() []jobs.Status
	Logger *slog.Logger
	// Redact cleans the error texts the server shows (a library's error
	// may quote a connection string); default: unchanged.
	Redact func(string) string
	// Rebuilds lists the index rebuilds in progress for the page; optional.
	Rebuilds func(ctx context.Context) ([]rebuild.Status, error)

	CacheTTL       time.Duration // Stats cache; default 1s
	SampleInterval time.Duration // history sampling; default 5s
	History        time.Duration // history kept; default 1h
}

// Server is the admin HTTP server.
type Server struct {
	cfg     Config
	ln      net.Listener
	srv     *http.Server
	fresh   *freshConns
	stats   *statsCache
	own     *prometheus.Registry // the Stats-derived gauges
	history *history
	log     *slog.Logger
}

// RoleOf adapts a relay to Config.Role.
func RoleOf(r *relay.Relay) func() map[string]bool {
	return func() map[string]bool {
		out := map[string]bool{}
		for _, s := range r.Streams() {
			out[s.Name] = false
		}
		for _, s := range r.Leading() {
			out[s] = true
		}
		return out
	}
}

// New checks cfg and binds the listening address; Run serves.
func New(cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.Gatherer == nil {
		return nil, errors.New("admin: config: Gatherer is required")
	}
	if cfg.Stats == nil {
		return nil, errors.New("admin: config: Stats is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Redact == nil {
		cfg.Redact = func(s string) string { return s }
	}
	if cfg.CacheTTL <= 0 {
		cfg.CacheTTL = time.Second
	}
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = 5 * time.Second
	}
	if cfg.History <= 0 {
		cfg.History = time.Hour
	}
	s := &Server{
		cfg:     cfg,
		stats:   &statsCache{fetch: cfg.Stats, ttl: cfg.CacheTTL},
		own:     prometheus.NewRegistry(),
		history: newHistory(int(cfg.History / cfg.SampleInterval)),
		log:     cfg.Logger,
	}
	s.own.MustRegister(&statsCollector{cache: s.stats})

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.Handle("GET /metrics", s.auth(promhttp.HandlerFor(prometheus.Gatherers{cfg.Gatherer, s.own},
		promhttp.HandlerOpts{ErrorLog: slogPrinter{s.log}, ErrorHandling: promhttp.ContinueOnError})))
	mux.Handle("GET /readyz", s.auth(http.HandlerFunc(s.readyz)))
	mux.Handle("GET /api/summary", s.auth(http.HandlerFunc(s.summary)))
	mux.Handle("GET /{$}", s.auth(http.HandlerFunc(s.page)))

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen on %s (flag --admin-addr): %w", cfg.Addr, err)
	}
	hosts, err := newHostCheck(ln.Addr(), cfg.Hosts)
	if err != nil {
		ln.Close()
		return nil, err
	}
	var handler http.Handler = mux
	if cfg.Token == "" {
		handler = hosts.wrap(mux)
	}
	s.ln = ln
	s.fresh = &freshConns{m: map[net.Conn]struct{}{}}
	s.srv = &http.Server{
		Handler:           handler,
		ConnState:         s.fresh.track,
		ReadHeaderTimeout: 10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	// Shutdown counts a connection that has sent no request yet (a
	// browser's preconnect, a TCP health check) as busy for 5s; it runs
	// this once its listener is closed.
	s.srv.RegisterOnShutdown(s.fresh.closeAll)
	return s, nil
}

// Addr is the address the server listens on, e.g. "127.0.0.1:9464".
func (s *Server) Addr() string { return s.ln.Addr().String() }

// shutdownGrace is how long requests in progress may finish after ctx
// ends; then their connections are closed. It bounds how long the admin
// server can hold up the relay's exit.
const shutdownGrace = time.Second

// Run serves and samples history until ctx ends, then shuts down
// gracefully: idle connections close at once, requests in progress get
// shutdownGrace.
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("admin: serving", "addr", "http://"+s.Addr()+"/", "auth", s.cfg.Token != "", "extra_hosts", s.cfg.Hosts)
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		s.sampleLoop(sctx)
	}()
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()

	var err error
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
		if err = s.srv.Shutdown(sctx); errors.Is(err, context.DeadlineExceeded) {
			// Requests still running past the grace are cut off: shutdown
			// is not a failure of the server.
			err = s.srv.Close()
		}
		cancel()
		<-errc
	case err = <-errc:
	}
	stopSampling()
	<-sampled
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	return nil
}

func (s *Server) auth(h http.Handler) http.Handler {
	if s.cfg.Token == "" {
		return h
	}
	want := []byte(s.cfg.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare(presented(r), want) == 1 {
			h.ServeHTTP(w, r)
			return
		}
		// Basic first: browsers prompt for it, and then send it with the
		// page's fetches too.
		w.Header().Add("WWW-Authenticate", `Basic realm="outboxd", charset="UTF-8"`)
		w.Header().Add("WWW-Authenticate", `Bearer realm="outboxd"`)
		http.Error(w, "unauthorized: send Authorization: Bearer <admin token>", http.StatusUnauthorized)
	})
}

// presented is the token a request carries, as a bearer token or as the
// password of Basic credentials.
func presented(r *http.Request) []byte {
	h := r.Header.Get("Authorization")
	scheme, rest, _ := strings.Cut(h, " ")
	switch strings.ToLower(scheme) {
	case "bearer":
		return []byte(strings.TrimSpace(rest))
	case "basic":
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
		if err != nil {
			return nil
		}
		_, pass, _ := strings.Cut(string(b), ":")
		return []byte(pass)
	}
	return nil
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

// freshConns are the connections that have not sent a request yet.
type freshConns struct {
	mu sync.Mutex
	m  map[net.Conn]struct{}
}

func (f *freshConns) track(c net.Conn, st http.ConnState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st == http.StateNew {
		f.m[c] = struct{}{}
	} else {
		delete(f.m, c)
	}
}

func (f *freshConns) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.m {
		_ = c.Close()
	}
}

type slogPrinter struct{ l *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.l.Warn("admin: metrics: " + fmt.Sprint(v...)) }
