// Command worker runs one member of a fleetcap fleet: it serves the task
// types of package tasks under the caps of config.yaml, and the monitoring
// pages (metrics, asynqmon, semaphores).
//
//	worker [--config PATH]
//
// SIGINT or SIGTERM shut it down gracefully (exit 0). A bad config or bad
// arguments exit 2, and so does a Redis whose layout of fleetcap's keys is
// another build's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/monitoring"
	"github.com/fleetcap/fleetcap/tasks"
	"github.com/fleetcap/fleetcap/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(exitCode(run(ctx, os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
}

// usageError is bad input: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// exitCode decides the process's exit code, in one place.
func exitCode(err error, stderr io.Writer) int {
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "worker:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "worker:", err)
		return 1
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "config.yaml", "path of the config file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q (usage: worker [--config PATH])", fs.Args())}
	}
	cfg, err := config.LoadConfig(*configPath)
	if err != nil {
		return usageError{err}
	}
	defs := map[string]tasks.Definition{}
	for _, d := range tasks.All() {
		defs[d.Type] = d
	}
	var unknown []string
	for _, typ := range cfg.TaskTypes() {
		if _, ok := defs[typ]; !ok {
			unknown = append(unknown, typ)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return usageError{fmt.Errorf("config: tasks: no handler in this worker for task types %q", unknown)}
	}

	logger := slog.New(slog.NewTextHandler(stderr, nil))
	tp, shutdownTracing, err := monitoring.SetupTracing(ctx, "fleetcap-worker")
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer func() {
		// Flushes the spans still buffered; a failure loses them, so say so.
		if err := shutdownTracing(context.Background()); err != nil {
			fmt.Fprintln(stderr, "worker: tracing shutdown:", err)
		}
	}()

	keys, err := worker.NewKeyIndex(cfg)
	if err != nil {
		return usageError{err}
	}
	reg := monitoring.NewRegistry()
	metrics, err := monitoring.NewMetrics(reg)
	if err != nil {
		return err
	}
	w, err := worker.New(cfg, worker.WithObserver(metrics), worker.WithLogger(logger), worker.WithTracerProvider(tp))
	var fileErr *worker.EmbeddedFileError
	var layoutErr *worker.LayoutError
	if errors.As(err, &fileErr) || errors.As(err, &layoutErr) {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	defer w.Close()
	metrics.SetKeyLabels(w.KeyLabel, keys.RateKeyLabel)
	w.Use(monitoring.TracingMiddleware(tp, monitoring.WithIsFailure(worker.IsFailure)))
	for _, d := range defs {
		w.Handle(d.Type, d.Handler)
	}
	for _, k := range w.DeclaredKeys() {
		switch k.Template {
		case "":
			metrics.SetCapacity(k.Key, k.Capacity)
		case k.Key:
			// No capacity series: the template's seats in use sum its
			// rendered keys, which each have the capacity.
			metrics.DeclareKey(k.Key)
		}
	}
	for _, k := range keys.RateKeys() {
		metrics.SetRateLimit(k.Key, k.Limit)
	}
	for _, tk := range keys.TaskKeys() {
		whys := make([]string, len(tk.Reasons))
		for i, r := range tk.Reasons {
			whys[i] = string(r)
		}
		metrics.DeclareTask(tk.Key, tk.TaskType, tk.Rate, whys...)
	}
	keyInfos := func(context.Context) ([]monitoring.KeyInfo, error) {
		keys := w.DeclaredKeys()
		out := make([]monitoring.KeyInfo, len(keys))
		for i, k := range keys {
			out[i] = monitoring.KeyInfo{Key: k.Key, Capacity: k.Capacity, Template: k.Template}
		}
		return out, nil
	}
	rooms, err := monitoring.NewRoomCollector(w.Semaphore(), keyInfos, monitoring.RoomCollectorOptions{Logger: logger})
	if err != nil {
		return err
	}
	reg.MustRegister(monitoring.NewQueueCollector(w.Inspector(), monitoring.QueueCollectorOptions{Logger: logger}), rooms)

	srv, err := monitoring.NewServer(monitoring.ServerOptions{
		Addr:      cfg.Monitoring.Addr,
		Gatherer:  reg,
		Semaphore: w.Semaphore(),
		Keys:      keyInfos,
		LookupKey: func(key string) (monitoring.KeyInfo, bool) {
			k, ok := keys.LookupCap(key)
			return monitoring.KeyInfo{Key: k.Key, Capacity: k.Capacity, Template: k.Template}, ok
		},
		RateLimiter: w.Limiter(),
		RateKeys: func(context.Context) ([]monitoring.RateKeyInfo, error) {
			declared := keys.RateKeys()
			out := make([]monitoring.RateKeyInfo, 0, len(declared))
			for _, k := range declared {
				out = append(out, rateKeyInfo(k))
			}
			for _, key := range w.RenderedRateKeys() {
				if k, ok := keys.LookupRate(key); ok {
					out = append(out, rateKeyInfo(k))
				}
			}
			return out, nil
		},
		LookupRateKey: func(key string) (monitoring.RateKeyInfo, bool) {
			k, ok := keys.LookupRate(key)
			return rateKeyInfo(k), ok
		},
		Overrides:        w.Overrides(),
		AdminToken:       cfg.Monitoring.AdminToken,
		RedisConnOpt:     w.RedisConnOpt(),
		AsynqmonWritable: !cfg.Monitoring.ReadOnly(),
		Ready:            w.Ping,
		Logger:           logger,
	})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", cfg.Monitoring.Addr)
	if err != nil {
		return fmt.Errorf("monitoring: %w", err)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	base := "http://" + l.Addr().String()
	where := "embedded Redis at " + cfg.Redis.EmbeddedAddr
	if !cfg.Redis.Embedded() {
		where = "Redis from the config"
	}
	fmt.Fprintf(stdout, "fleetcap worker on %s\n  semaphores: %s/semaphores\n  asynqmon:   %s/monitoring/\n  metrics:    %s/metrics\n",
		where, base, base, base)
	if cfg.Redis.Embedded() && cfg.Redis.EmbeddedFile != "" {
		fmt.Fprintf(stdout, "  kept in:    %s (saved at stop, loaded at start)\n", cfg.Redis.EmbeddedFile)
	}

	runErr := w.Run(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.Warn("monitoring: shutdown", "err", err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Warn("monitoring: serve", "err", err)
	}
	return runErr
}

func rateKeyInfo(k worker.DeclaredRateKey) monitoring.RateKeyInfo {
	return monitoring.RateKeyInfo{Key: k.Key, Template: k.Template, Limit: k.Limit, MaxCost: k.MaxCost}
}
