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
	// AdminToken guards POST /api/semaphores/{key}/release-all (as
	// "Authorization: Bearer <token>"). Empty: the endpoint answers 404.
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
// /semaphores, /api/semaphores, /api/semaphores/{key}/release-all,
// /healthz and /readyz. Create it with NewServer; serve it with
// ListenAndServe or Serve, or mount Handler in a server of your own.
type Server struct {
	http    *http.Server
	log     *slog.Logger
	snap    *snapshotter
	token   []byte // sha256 of AdminToken; nil when none
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
		s.snap = &snapshotter{sem: opts.Semaphore, keys: opts.Keys, busiest: opts.BusiestKeys, cacheFor: 500 * time.Millisecond}
		mux.HandleFunc("GET /semaphores", s.handlePage)
		mux.HandleFunc("GET /api/semaphores", s.handleList)
		mux.HandleFunc("POST /api/semaphores/{key}/release-all", s.handleReleaseAll)
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
	rows, err := s.snap.snapshot(r.Context())
	if err != nil {
		s.log.Warn("monitoring: read semaphores", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	if rows == nil {
		rows = []SemaphoreStatus{}
	}
	writeJSON(w, http.StatusOK, rows)
}

func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) {
	rows, err := s.snap.snapshot(r.Context())
	data := struct {
		Rows  []SemaphoreStatus
		Error string
	}{Rows: rows}
	if err != nil {
		data.Error = err.Error()
	}
	if data.Rows == nil {
		data.Rows = []SemaphoreStatus{}
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
	if s.token == nil {
		http.NotFound(w, r)
		return
	}
	if !s.authorized(r) {
		s.log.Warn("monitoring: admin request refused", "path", r.URL.Path, "remote", r.RemoteAddr)
		w.Header().Set("WWW-Authenticate", `Bearer realm="fleetcap"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong admin token"})
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
