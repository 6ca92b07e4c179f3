// Package worker is fleetcap's framework: asynq workers whose task types
// carry fleet-wide concurrency caps and rate limits. Each limited task
// passes its limits (package admission: a leased seat of each cap, the
// tokens of each rate limit) before its handler runs; when one holds it
// back the task waits or goes back to its queue without counting as a
// failure, and is woken when its turn comes.
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

	"github.com/fleetcap/fleetcap/admission"
	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/internal/asynqx"
	"github.com/fleetcap/fleetcap/internal/layout"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// Observer receives what the worker reports beside the semaphore's own
// events (admission.Observer); monitoring.Metrics implements it.
type Observer = admission.Observer

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
	table     *admission.Table     // the limits of the task types
	adm       *admission.Admitter  // the path of a limited task
	limiter   *ratelimit.Limiter
	overrides *control.Reader // operators' capacity and rate overrides
	asynqLog  *asynqLogger

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
	w := &Worker{cfg: cfg, mux: asynq.NewServeMux()}
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
	var err error
	if w.table, err = admission.NewTable(cfg); err != nil {
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
	if w.layout, err = admission.ClaimLayout(ctx, w.rdb, w.cfg, w.table, "worker", w.log); err != nil {
		return err // before anything reads or writes fleetcap's keys
	}
	var obs semaphore.Observer
	if w.opts.observer != nil {
		obs = w.opts.observer
	}
	waker := admission.NewWaker(w.rdb, w.log)
	w.sem, err = semaphore.New(w.rdb, semaphore.Options{
		OnWake:         waker.OnWake,
		Prefix:         w.cfg.Semaphore.Prefix,
		DefaultTTL:     w.cfg.Semaphore.DefaultTTL,
		Logger:         w.log,
		TracerProvider: w.opts.tracer,
		Observer:       obs,
		// A slot holds one task: a key's spare seats never need to
		// outnumber the slots.
		SpareSeats: w.cfg.Worker.Concurrency,
	})
	if err != nil {
		return err
	}
	waker.SetSemaphore(w.sem)
	rateObs, _ := w.opts.observer.(ratelimit.Observer)
	if w.limiter, err = ratelimit.New(w.rdb, ratelimit.Options{Prefix: w.cfg.Semaphore.Prefix, Observer: rateObs}); err != nil {
		return err
	}
	w.insp = asynq.NewInspector(w.connOpt)
	made := w.connOpt.MakeRedisClient()
	serverRDB, ok := made.(redis.UniversalClient)
	if !ok {
		return fmt.Errorf("worker: asynq made a %T, not a go-redis client", made)
	}
	w.server = asynqx.NewServerClient(serverRDB, w.cfg.Semaphore.Prefix, slices.Collect(maps.Keys(w.cfg.Worker.Queues)), w.cfg.Worker.TaskCheckInterval, w.log)
	waker.SetServer(w.server)
	w.asynqLog.kept = w.server.Kept
	// A worker must not serve before it knows the overrides in force: a
	// paused key would run.
	if w.overrides, err = admission.OpenOverrides(ctx, w.rdb, w.cfg.Semaphore.Prefix, w.log); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.adm, err = admission.New(admission.Options{
		Redis: w.rdb, Table: w.table, Semaphore: w.sem, Limiter: w.limiter, Sizes: w.overrides,
		Observer: w.opts.observer, Logger: w.log, ParkedRetry: w.cfg.Worker.ParkedRetry, Waker: waker,
	})
	return err
}

// Handle registers the handler of a task type. If the type has caps or
// rate limits in the config, its tasks pass them first (package
// admission).
func (w *Worker) Handle(taskType string, h asynq.Handler) {
	w.mux.Handle(taskType, w.limited(taskType, h))
}

// limited wraps h in the limits of taskType, if it has any: a task runs
// once it passed them, or goes back to its queue without a failure.
func (w *Worker) limited(taskType string, h asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		if !w.table.Limited(taskType) {
			return h.ProcessTask(ctx, t)
		}
		growStack()
		adm, back, err := w.adm.Admit(ctx, taskType, t)
		switch {
		case err != nil:
			return err // its payload is broken: never run it without its limits
		case back != nil:
			return w.requeue(ctx, taskType, back)
		}
		back, err = adm.Run(ctx, h, t)
		if back != nil {
			return w.requeue(ctx, taskType, back)
		}
		return err
	})
}

// Fence is, in a handler, the fencing token of its task's seat of key (the
// rendered key, such as "tenant:acme"), to pass to the capped resource so
// that it refuses the late writes of a holder whose seat lapsed (see
// semaphore.Permit.Fence). It reports false when the task holds no seat
// of key.
func Fence(ctx context.Context, key string) (uint64, bool) { return admission.Fence(ctx, key) }

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
	table, err := admission.NewTable(w.cfg)
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
	w.table, w.adm.Table = table, table
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

// DeclaredKey is a semaphore key the config declares, or a key rendered
// recently from a declared template (admission.DeclaredKey).
type DeclaredKey = admission.DeclaredKey

// DeclaredKeys lists every plain cap key and template of the config, then
// the rendered keys of templates that this process holds seats of, and the
// ones it rendered most recently (at most 200 of those).
func (w *Worker) DeclaredKeys() []DeclaredKey { return w.adm.DeclaredKeys() }

// KeyLabel names a cap key for metrics: the template a rendered key came
// from, so that per-tenant keys do not make one series each.
func (w *Worker) KeyLabel(key string) string { return w.adm.KeyLabel(key) }

// RenderedRateKeys lists the rate-limit keys this process rendered from
// templates lately (the 200 it used last), for the monitoring page.
func (w *Worker) RenderedRateKeys() []string { return w.adm.RenderedRateKeys() }

// Close frees what New opened; Run calls it when it returns.
func (w *Worker) Close() {
	w.closeClients()
	if err := w.stopEmbedded(); err != nil {
		w.log.Error(err.Error())
	}
}

// closeClients closes, once, everything of the worker that talks to Redis,
// so that none of it (a subscription that reconnects) dials an embedded
// Redis that stops after it.
func (w *Worker) closeClients() {
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
	stopped := false
	defer func() {
		if !stopped {
			w.Close()
		}
	}()

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
	w.adm.Start(recoverCtx) // before any handler runs
	if err := srv.Start(handler); err != nil {
		return fmt.Errorf("worker: start: %w", err)
	}
	go w.recoverLoop(recoverCtx)
	w.log.Info("worker: serving", "queues", w.cfg.Worker.Queues, "concurrency", w.cfg.Worker.Concurrency,
		"limited_task_types", w.table.Types(), "embedded_redis", w.embedded != nil)
	<-ctx.Done()
	stopRecover()
	w.log.Info("worker: shutting down", "timeout", w.cfg.Worker.ShutdownTimeout)
	w.server.Stop()   // an idle dequeue stops waiting for work
	srv.Stop()        // no new tasks
	_ = w.sem.Close() // waiters abort and requeue; renewal stops
	srv.Shutdown()    // in-flight work finishes or is requeued by asynq
	stopped = true
	w.closeClients() // then the embedded Redis, once nothing dials it
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

// growStack grows the calling goroutine's stack to what a limited task's
// path needs, in one copy made while the stack is shallow. asynq runs
// each task on a new goroutine, whose stack starts small; the admission
// path outgrew it deep inside, where each growth copies and adjusts
// every frame. S2's capped worker spent 11 to 12% of its CPU growing
// stacks, and 6 to 7% with growStack (three rounds each, alternating).
//
//go:noinline
func growStack() {
	var pad [stackPad]byte
	i := int(stackSink) // 0, unknown to the compiler
	pad[i] = 1
	if pad[stackPad-1-i] != 0 { // never: stackSink is only read
		stackSink = 1
	}
}

// stackPad is the stack growStack makes room for: more than the
// admission path's deepest frames (about 7 KiB), so that the stack grows
// to 32 KiB in one copy (a 7 KiB pad, growing it to 16 KiB, saved less).
const stackPad = 12 << 10

// stackSink keeps growStack's pad from being compiled away; it stays 0.
var stackSink byte
