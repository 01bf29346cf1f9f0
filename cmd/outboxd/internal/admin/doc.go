// Package admin is outboxd's operator HTTP server: Prometheus metrics,
// health and readiness probes, a JSON summary and the dashboard page.
//
// Contracts:
//
//   - It listens on loopback (127.0.0.1:9464) unless told otherwise; New
//     binds the address, so a port in use fails at start-up, and Addr
//     reports the bound address (tests listen on port 0).
//   - With a Token, every endpoint but /healthz answers 401 unless the
//     request carries "Authorization: Bearer <token>" or HTTP Basic
//     credentials whose password is the token (so a browser can open the
//     page: it prompts once and sends the credentials with the page's own
//     requests). The token is never logged, and the error texts /readyz
//     and /api/summary show pass through Config.Redact.
//   - Without a Token, every endpoint but /healthz answers 421 unless the
//     Host header names the server: its bound address (host:port); on
//     loopback also localhost, 127.0.0.1 and [::1] with its port; bound to
//     every interface, localhost or any IP address with its port; or one of
//     Config.Hosts (a name on any port, or an exact host:port). A web page
//     on another name re-resolved to this address (DNS rebinding) thus
//     reads nothing. With a Token the token is the protection instead.
//   - /metrics serves the injected Gatherer plus, computed at scrape time
//     from Stats, outboxd_backlog_events{stream},
//     outboxd_oldest_unacked_age_seconds{stream},
//     outboxd_dead_letters_parked{index} and outboxd_stats_up. Stats are
//     cached for CacheTTL (1s) so scrapes, the page and the sampler do not
//     each query PostgreSQL; after a slow query (it counts the backlog),
//     for 50 times its duration, at most a minute.
//   - /readyz runs every Ready check (each bounded by 3s) and answers 503
//     naming the failing checks; a standby is ready (it serves as soon as
//     it takes over), the response says which streams this process leads.
//   - / is one embedded HTML file with inline CSS and JavaScript, nothing
//     fetched from elsewhere; it polls /api/summary every 2s. The history
//     behind its charts is a ring buffer sampled every SampleInterval (5s)
//     for History (1h), in memory, per process.
package admin
