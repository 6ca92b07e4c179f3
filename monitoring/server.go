package monitoring

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/hibiken/asynqmon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// ServerOptions configures NewServer.
type ServerOptions struct {
	// Addr is the listen address of ListenAndServe. Default
	// "127.0.0.1:8080".
	Addr string
	// Gatherer is served at GET /metrics: the private registry holding
	// Metrics, the QueueCollector and the runtime collectors (see
	// NewRegistry). Nil: no /metrics.
	Gatherer prometheus.Gatherer
	// Semaphore and Keys feed GET /semaphores, GET /api/semaphores and the
	// release-all endpoint; set both or neither. Keys lists the declared
	// keys with their capacity (see KeyInfo); the page reads the holders of
	// every plain and rendered key it lists, once per refresh.
	Semaphore *semaphore.Service
	Keys      func(ctx context.Context) ([]KeyInfo, error)
	// BusiestKeys is how many rendered keys of one template the page shows
	// (the busiest). Default 10.
	BusiestKeys int
	// LookupKey resolves the {key} of PUT /api/semaphores/{key}/capacity: a
	// declared key, a declared template, or a key a template renders, with
	// its configured capacity. Required with Overrides.
	LookupKey func(key string) (KeyInfo, bool)
	// RateLimiter and RateKeys add one row of kind "rate" per rate-limit
	// key to the page and GET /api/semaphores; set both or neither (and
	// Semaphore with them). RateKeys lists the declared keys and templates
	// and the rendered keys in use (see RateKeyInfo).
	RateLimiter *ratelimit.Limiter
	RateKeys    func(ctx context.Context) ([]RateKeyInfo, error)
	// LookupRateKey resolves the {key} of PUT /api/ratelimits/{key} as
	// LookupKey does. Required with Overrides and RateLimiter.
	LookupRateKey func(key string) (RateKeyInfo, bool)
	// Overrides are the fleet's runtime overrides (package control): the
	// rows show the capacity and rate in force beside the configured ones,
	// and with AdminToken set, PUT and DELETE /api/semaphores/{key}/capacity
	// and /api/ratelimits/{key} write them through Overrides.Store(). Nil:
	// configured values only, and those endpoints answer 404.
	Overrides *control.Reader
	// AdminToken guards POST /api/semaphores/{key}/release-all and the
	// override endpoints (as "Authorization: Bearer <token>"). Empty: they
	// answer 404.
	AdminToken string
	// RedisConnOpt is asynq's Redis, for asynqmon at /monitoring/ and for
	// the default readiness check. Nil: no asynqmon.
	RedisConnOpt asynq.RedisConnOpt
	// AsynqmonWritable lets asynqmon change queues and tasks (delete, run,
	// archive, pause). Default false: read-only, because the monitoring
	// server has no login.
	AsynqmonWritable bool
	// Ready answers GET /readyz: nil error means ready. Default: PING on
	// RedisConnOpt. One of Ready and RedisConnOpt is required.
	Ready func(ctx context.Context) error
	// Logger receives admin actions and errors. Default slog.Default().
	Logger *slog.Logger
}

// Server is the monitoring HTTP server: /metrics, /monitoring/ (asynqmon),
// /semaphores, /api/semaphores, /api/semaphores/{key}/release-all, the
// override endpoints /api/semaphores/{key}/capacity and
// /api/ratelimits/{key}, /healthz and /readyz. Create it with NewServer; serve it with
// ListenAndServe or Serve, or mount Handler in a server of your own.
type Server struct {
	http    *http.Server
	log     *slog.Logger
	snap    *snapshotter
	ctl     *controlAPI // nil without Overrides
	token   []byte      // sha256 of AdminToken; nil when none
	ready   func(context.Context) error
	page    *template.Template
	closers []func() error
}

//go:embed semaphores.html
var semaphoresHTML string

// readyTimeout bounds one readiness check.
const readyTimeout = 2 * time.Second

// NewServer builds the server; nothing listens until ListenAndServe or
// Serve.
func NewServer(opts ServerOptions) (*Server, error) {
	if (opts.Semaphore == nil) != (opts.Keys == nil) {
		return nil, errors.New("monitoring: ServerOptions.Semaphore and ServerOptions.Keys go together")
	}
	if (opts.RateLimiter == nil) != (opts.RateKeys == nil) {
		return nil, errors.New("monitoring: ServerOptions.RateLimiter and ServerOptions.RateKeys go together")
	}
	if opts.RateLimiter != nil && opts.Semaphore == nil {
		return nil, errors.New("monitoring: ServerOptions.RateLimiter needs Semaphore (the rows share the semaphores page)")
	}
	if opts.Overrides != nil {
		if opts.Semaphore == nil || opts.LookupKey == nil {
			return nil, errors.New("monitoring: ServerOptions.Overrides needs Semaphore, Keys and LookupKey")
		}
		if opts.RateLimiter != nil && opts.LookupRateKey == nil {
			return nil, errors.New("monitoring: ServerOptions.Overrides with RateLimiter needs LookupRateKey")
		}
	}
	if opts.Ready == nil && opts.RedisConnOpt == nil {
		return nil, errors.New("monitoring: ServerOptions needs Ready or RedisConnOpt for /readyz")
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:8080"
	}
	if opts.BusiestKeys <= 0 {
		opts.BusiestKeys = 10
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	page, err := template.New("semaphores").Parse(semaphoresHTML)
	if err != nil {
		return nil, fmt.Errorf("monitoring: page template: %w", err)
	}
	s := &Server{log: opts.Logger, ready: opts.Ready, page: page}
	if opts.AdminToken != "" {
		sum := sha256.Sum256([]byte(opts.AdminToken))
		s.token = sum[:]
	}
	if s.ready == nil {
		rdb, ok := opts.RedisConnOpt.MakeRedisClient().(redis.UniversalClient)
		if !ok {
			return nil, fmt.Errorf("monitoring: unsupported RedisConnOpt %T", opts.RedisConnOpt)
		}
		s.closers = append(s.closers, rdb.Close)
		s.ready = func(ctx context.Context) error { return rdb.Ping(ctx).Err() }
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/semaphores", http.StatusFound)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeText(w, http.StatusOK, "ok") })
	mux.HandleFunc("GET /readyz", s.handleReady)
	if opts.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{
			ErrorLog:      slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
			ErrorHandling: promhttp.ContinueOnError,
		}))
	}
	if opts.RedisConnOpt != nil {
		mon := asynqmon.New(asynqmon.Options{
			RootPath:     "/monitoring",
			RedisConnOpt: opts.RedisConnOpt,
			ReadOnly:     !opts.AsynqmonWritable,
		})
		s.closers = append(s.closers, mon.Close)
		mux.Handle("/monitoring/", mon)
	}
	if opts.Semaphore != nil {
		s.snap = &snapshotter{
			sem: opts.Semaphore, keys: opts.Keys, busiest: opts.BusiestKeys, cacheFor: 500 * time.Millisecond,
			limiter: opts.RateLimiter, rateKeys: opts.RateKeys, overrides: opts.Overrides,
		}
		mux.HandleFunc("GET /semaphores", s.handlePage)
		mux.HandleFunc("GET /api/semaphores", s.handleList)
		mux.HandleFunc("POST /api/semaphores/{key}/release-all", s.handleReleaseAll)
	}
	if opts.Overrides != nil {
		s.ctl = &controlAPI{server: s, overrides: opts.Overrides, lookupKey: opts.LookupKey, lookupRateKey: opts.LookupRateKey}
		capacity := s.ctl.capacityOverride()
		mux.HandleFunc("PUT /api/semaphores/{key}/capacity", capacity.put)
		mux.HandleFunc("DELETE /api/semaphores/{key}/capacity", capacity.delete)
		if opts.RateLimiter != nil {
			rate := s.ctl.rateOverride()
			mux.HandleFunc("PUT /api/ratelimits/{key}", rate.put)
			mux.HandleFunc("DELETE /api/ratelimits/{key}", rate.delete)
		}
	}
	s.http = &http.Server{
		Addr:              opts.Addr,
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// Handler is the server's routes, for tests or for mounting elsewhere.
func (s *Server) Handler() http.Handler { return s.http.Handler }

// Addr is the configured listen address.
func (s *Server) Addr() string { return s.http.Addr }

// ListenAndServe listens on Addr and serves until Shutdown, then returns
// http.ErrServerClosed.
func (s *Server) ListenAndServe() error { return s.http.ListenAndServe() }

// Serve serves on l until Shutdown, then returns http.ErrServerClosed.
func (s *Server) Serve(l net.Listener) error { return s.http.Serve(l) }

// Shutdown stops the server gracefully (see http.Server.Shutdown) and
// closes its Redis connections (asynqmon's and the readiness check's).
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.http.Shutdown(ctx)
	for _, c := range s.closers {
		err = errors.Join(err, c())
	}
	s.closers = nil
	return err
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
		return
	}
	writeText(w, http.StatusOK, "ok")
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	snap, err := s.snap.snapshot(r.Context())
	if err != nil {
		s.log.Warn("monitoring: read semaphores", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, snap.rows())
}

func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) {
	snap, err := s.snap.snapshot(r.Context())
	data := struct {
		Rows  []any
		Error string
		Admin bool // the override form is offered
	}{Rows: snap.rows(), Admin: s.ctl != nil && s.token != nil}
	if err != nil {
		data.Error = err.Error()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := s.page.Execute(w, data); err != nil {
		s.log.Warn("monitoring: render semaphores page", "err", err)
	}
}

// handleReleaseAll force-releases every seat of a key. The checks run in
// this order: no admin token configured (404, as if the route did not
// exist), missing or wrong bearer token (401), unknown key (404).
func (s *Server) handleReleaseAll(w http.ResponseWriter, r *http.Request) {
	if !s.admit(w, r) {
		return
	}
	key := r.PathValue("key")
	known, err := s.snap.isKnown(r.Context(), key)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	if !known {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("unknown semaphore key %q", key)})
		return
	}
	n, err := s.snap.sem.ForceReleaseAll(r.Context(), key)
	if err != nil {
		s.log.Error("monitoring: admin release-all failed", "key", key, "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	s.snap.invalidate()
	s.log.Warn("monitoring: admin released every seat", "key", key, "displaced", n, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, map[string]int{"displaced": n})
}

// admit answers an admin request that may not proceed and reports whether
// it may: 404 when no admin token is configured (as if the route did not
// exist), 401 for a missing or wrong bearer token.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) bool {
	if s.token == nil {
		http.NotFound(w, r)
		return false
	}
	if !s.authorized(r) {
		s.log.Warn("monitoring: admin request refused", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		w.Header().Set("WWW-Authenticate", `Bearer realm="fleetcap"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong admin token"})
		return false
	}
	return true
}

// authorized compares the bearer token in constant time (hashing both
// sides first so that the length does not leak either).
func (s *Server) authorized(r *http.Request) bool {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(sum[:], s.token) == 1
}

func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = fmt.Fprintln(w, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
