// Package worker is fleetcap's framework: asynq workers whose task types
// carry fleet-wide concurrency caps. Each capped task takes a leased seat of
// its semaphore (package semaphore) before its handler runs; when the
// semaphore is full the task waits or goes back to its queue without
// counting as a failure, and is woken when a seat frees.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/internal/asynqx"
	"github.com/fleetcap/fleetcap/internal/layout"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// Observer receives what the worker reports beside the semaphore's own
// events; monitoring.Metrics implements it.
type Observer interface {
	semaphore.Observer
	// Requeued is called when a task goes back to its queue without a seat;
	// why is one of the RequeueReasons.
	Requeued(key, taskType, why string)
	// LeaseLost is called when a running task's seat is lost.
	LeaseLost(key, taskType string)
	// Waiting is called with +1 when a task of a cap of key takes a worker
	// slot and asks for its seat, and with -1 when it runs or goes back: it
	// counts the slots that hold a capped task which is not running. A task
	// that runs is counted out before its standby place goes to the next.
	Waiting(key string, delta int)
}

// Option tunes New.
type Option func(*options)

type options struct {
	observer Observer
	logger   *slog.Logger
	tracer   trace.TracerProvider
}

// WithObserver reports the worker's and the semaphore's events to obs.
func WithObserver(obs Observer) Option { return func(o *options) { o.observer = obs } }

// WithLogger sets the logger; default slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithTracerProvider sets the tracer provider of the semaphore.acquire
// spans; default otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option { return func(o *options) { o.tracer = tp } }

// Worker is one fleet member: an asynq server whose handlers are wrapped in
// the fleet-wide caps of config.yaml.
type Worker struct {
	cfg  *Config
	opts options
	log  *slog.Logger

	embedded  *miniredis.Miniredis // nil unless redis.url and cluster_addrs are empty
	connOpt   asynq.RedisConnOpt
	rdb       redis.UniversalClient
	layout    *layout.Lease // this process's lease on the Redis layout
	sem       *semaphore.Service
	insp      *asynq.Inspector
	mux       *asynq.ServeMux
	server    *asynqx.ServerClient // the asynq server's Redis client
	caps      *capTable
	rates     rateTable
	limiter   *ratelimit.Limiter
	rateObs   ratelimit.Observer // nil: none
	rateWakes rateWakes
	// recentRates are the rate-limit keys rendered lately (for monitoring)
	recentRates *recentKeys
	runCtx      context.Context // the serving worker's: done at shutdown
	waker       *waker
	rooms       roomKeys
	recent      *recentKeys
	overrides   *control.Reader // operators' capacity and rate overrides
	asynqLog    *asynqLogger

	embeddedStop sync.Once // stopEmbedded saves once
	embeddedErr  error     // and what it returned

	mu          sync.Mutex
	middlewares []asynq.MiddlewareFunc
	ran         bool
	closeOnce   sync.Once
}

// New builds a worker from cfg (as LoadConfig returns it; a Config built in
// code gets its defaults and is validated here). With the embedded default
// it starts the in-process Redis now. It refuses with a *LayoutError when
// Redis holds another build's layout of fleetcap's keys.
func New(cfg *Config, opts ...Option) (*Worker, error) {
	if cfg == nil {
		return nil, errors.New("worker: New: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, mux: asynq.NewServeMux(), recent: newRecentKeys(), recentRates: newRecentKeys()}
	for _, o := range opts {
		o(&w.opts)
	}
	if w.opts.logger == nil {
		w.opts.logger = slog.Default()
	}
	if w.opts.tracer == nil {
		w.opts.tracer = otel.GetTracerProvider()
	}
	w.log = w.opts.logger
	w.asynqLog = newAsynqLogger(w.log)
	caps, err := newCapTable(cfg)
	if err != nil {
		return nil, err
	}
	w.caps = caps
	if w.rates, err = newRateTable(cfg); err != nil {
		return nil, err
	}

	if cfg.Redis.Embedded() {
		if err := w.startEmbedded(); err != nil {
			return nil, err
		}
	}
	if err := w.connect(); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

func (w *Worker) connect() error {
	var err error
	if w.connOpt, err = w.cfg.Redis.AsynqConnOpt(); err != nil {
		return err
	}
	if w.rdb, err = w.cfg.Redis.NewClient(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeCallTimeout)
	defer cancel()
	if w.layout, err = claimLayout(ctx, w.rdb, w.cfg, w.caps, "worker", w.log); err != nil {
		return err // before anything reads or writes fleetcap's keys
	}
	var obs semaphore.Observer
	if w.opts.observer != nil {
		obs = w.opts.observer
	}
	w.waker = &waker{log: w.log, rdb: w.rdb}
	w.sem, err = semaphore.New(w.rdb, semaphore.Options{
		OnWake:         w.waker.onWake,
		Prefix:         w.cfg.Semaphore.Prefix,
		DefaultTTL:     w.cfg.Semaphore.DefaultTTL,
		Logger:         w.log,
		TracerProvider: w.opts.tracer,
		Observer:       obs,
	})
	if err != nil {
		return err
	}
	w.rateObs, _ = w.opts.observer.(ratelimit.Observer)
	if w.limiter, err = ratelimit.New(w.rdb, ratelimit.Options{Observer: w.rateObs}); err != nil {
		return err
	}
	w.insp = asynq.NewInspector(w.connOpt)
	w.waker.sem = w.sem
	made := w.connOpt.MakeRedisClient()
	serverRDB, ok := made.(redis.UniversalClient)
	if !ok {
		return fmt.Errorf("worker: asynq made a %T, not a go-redis client", made)
	}
	w.server = asynqx.NewServerClient(serverRDB, slices.Collect(maps.Keys(w.cfg.Worker.Queues)), w.cfg.Worker.TaskCheckInterval, w.log)
	w.asynqLog.kept = w.server.Kept
	// A worker must not serve before it knows the overrides in force: a
	// paused key would run.
	if w.overrides, err = openOverrides(ctx, w.rdb, w.log); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// openOverrides reads the runtime overrides on rdb and keeps them current.
func openOverrides(ctx context.Context, rdb redis.UniversalClient, log *slog.Logger) (*control.Reader, error) {
	store, err := control.NewStore(rdb, control.Options{})
	if err != nil {
		return nil, err
	}
	r, err := control.NewReader(ctx, store, control.ReaderOptions{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("runtime overrides: %w", err)
	}
	return r, nil
}

// Handle registers the handler of a task type. If the type is capped in the
// config, the cap wraps the handler.
func (w *Worker) Handle(taskType string, h asynq.Handler) {
	w.mux.Handle(taskType, w.capped(taskType, h))
}

// HandleFunc registers a handler function for a task type.
func (w *Worker) HandleFunc(taskType string, fn func(ctx context.Context, t *asynq.Task) error) {
	w.Handle(taskType, asynq.HandlerFunc(fn))
}

// Use adds middleware that runs around every handler, outside the caps (so
// that a tracing middleware sees the seat taken inside its span).
func (w *Worker) Use(mws ...asynq.MiddlewareFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.middlewares = append(w.middlewares, mws...)
}

// SetCaps declares (or replaces) the caps of a task type in code, as
// config.yaml would. Call it before Handle for that type and before Run.
func (w *Worker) SetCaps(taskType string, caps ...CapConfig) error {
	if w.cfg.Tasks == nil {
		w.cfg.Tasks = map[string]TaskConfig{}
	}
	old, had := w.cfg.Tasks[taskType]
	t := old
	t.Semaphore, t.Semaphores = nil, caps
	w.cfg.Tasks[taskType] = t
	w.cfg.ApplyDefaults()
	table, err := newCapTable(w.cfg)
	if err == nil {
		err = w.cfg.Validate()
	}
	if err != nil {
		if had {
			w.cfg.Tasks[taskType] = old
		} else {
			delete(w.cfg.Tasks, taskType)
		}
		return err
	}
	w.caps = table
	return nil
}

// Semaphore is the worker's semaphore service (for monitoring).
func (w *Worker) Semaphore() *semaphore.Service { return w.sem }

// RedisConnOpt is the worker's asynq connection (for monitoring).
func (w *Worker) RedisConnOpt() asynq.RedisConnOpt { return w.connOpt }

// Inspector is the worker's asynq inspector (for monitoring).
func (w *Worker) Inspector() *asynq.Inspector { return w.insp }

// Ping checks that Redis answers.
func (w *Worker) Ping(ctx context.Context) error { return w.rdb.Ping(ctx).Err() }

// Config is the worker's config, defaults applied.
func (w *Worker) Config() *Config { return w.cfg }

// Overrides is the worker's reader of the operators' runtime overrides
// (for monitoring).
func (w *Worker) Overrides() *control.Reader { return w.overrides }

// Limiter is the worker's rate limiter (for monitoring).
func (w *Worker) Limiter() *ratelimit.Limiter { return w.limiter }

// Close frees what New opened; Run calls it when it returns.
func (w *Worker) Close() {
	w.closeOnce.Do(func() {
		if w.layout != nil {
			_ = w.layout.Close() // a lease not given back lapses by itself
		}
		if w.overrides != nil {
			w.overrides.Close()
		}
		if w.sem != nil {
			_ = w.sem.Close()
		}
		if w.server != nil {
			_ = w.server.Close()
		}
		if w.insp != nil {
			_ = w.insp.Close()
		}
		if w.rdb != nil {
			_ = w.rdb.Close()
		}
		if err := w.stopEmbedded(); err != nil {
			w.log.Error(err.Error())
		}
	})
}

// Run serves tasks until ctx is done, then shuts down gracefully: it stops
// fetching, closes the semaphore service (waiting tasks requeue, renewal
// stops), lets in-flight work finish within worker.shutdown_timeout, and
// leaves still-held leases to lapse. It can be called once.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.ran {
		w.mu.Unlock()
		return errors.New("worker: Run called twice")
	}
	w.ran = true
	mws := append([]asynq.MiddlewareFunc(nil), w.middlewares...)
	w.mu.Unlock()
	defer w.Close()

	if err := w.Ping(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // told to stop before it served anything
		}
		return fmt.Errorf("worker: redis: %w", err)
	}
	srv := asynq.NewServerFromRedisClient(w.server, w.asynqConfig())
	handler := asynq.Handler(w.mux)
	for i := len(mws) - 1; i >= 0; i-- {
		handler = mws[i](handler)
	}
	recoverCtx, stopRecover := context.WithCancel(context.Background())
	defer stopRecover()
	w.runCtx = recoverCtx // before any handler runs
	if err := srv.Start(handler); err != nil {
		return fmt.Errorf("worker: start: %w", err)
	}
	go w.recoverLoop(recoverCtx)
	w.log.Info("worker: serving", "queues", w.cfg.Worker.Queues, "concurrency", w.cfg.Worker.Concurrency,
		"capped_task_types", w.caps.types(), "embedded_redis", w.embedded != nil)
	<-ctx.Done()
	stopRecover()
	w.log.Info("worker: shutting down", "timeout", w.cfg.Worker.ShutdownTimeout)
	w.server.Stop()   // an idle dequeue stops waiting for work
	srv.Stop()        // no new tasks
	_ = w.sem.Close() // waiters abort and requeue; renewal stops
	srv.Shutdown()    // in-flight work finishes or is requeued by asynq
	if err := w.stopEmbedded(); err != nil {
		return err
	}
	w.log.Info("worker: stopped")
	return nil
}

// asynqConfig is the asynq server config: requeues for a seat are not
// failures and come back after the delay the requeue asks for.
func (w *Worker) asynqConfig() asynq.Config {
	return asynq.Config{
		Concurrency:     w.cfg.Worker.Concurrency,
		Queues:          w.cfg.Worker.Queues,
		ShutdownTimeout: w.cfg.Worker.ShutdownTimeout,
		// An idle processor waits for work in the server client (see
		// asynqx.ServerClient); asynq's own sleep between looks is kept
		// short.
		TaskCheckInterval:        time.Millisecond,
		DelayedTaskCheckInterval: w.cfg.Worker.DelayedTaskCheckInterval,
		IsFailure:                IsFailure,
		RetryDelayFunc:           RetryDelay,
		Logger:                   w.asynqLog,
		LogLevel:                 asynq.WarnLevel,
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			if IsFailure(err) {
				id, _ := asynq.GetTaskID(ctx)
				w.log.Warn("worker: task failed", "type", t.Type(), "id", id, "err", err)
			}
		}),
	}
}
