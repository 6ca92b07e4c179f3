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
	"slices"
	"syscall"
	"time"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/monitoring"
	"github.com/fleetcap/fleetcap/monitoring/workermon"
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
	cfg, handlers, err := loadConfig(args, stderr)
	if err != nil {
		return err
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

	reg := monitoring.NewRegistry()
	metrics, err := monitoring.NewMetrics(reg)
	if err != nil {
		return err
	}
	w, err := worker.New(cfg, worker.WithObserver(metrics), worker.WithLogger(logger), worker.WithTracerProvider(tp))
	if err != nil {
		return startError(err)
	}
	defer w.Close()
	w.Use(monitoring.TracingMiddleware(tp, monitoring.WithIsFailure(worker.IsFailure)))
	for _, d := range handlers {
		w.Handle(d.Type, d.Handler)
	}

	srv, err := workermon.NewServer(w, workermon.Options{Registry: reg, Metrics: metrics, Logger: logger})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", cfg.Monitoring.Addr)
	if err != nil {
		return fmt.Errorf("monitoring: %w", err)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	printPages(stdout, cfg, "http://"+l.Addr().String())

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

// loadConfig parses the arguments and loads the config, whose task types
// must each have a handler in package tasks; it returns those handlers.
func loadConfig(args []string, stderr io.Writer) (*config.Config, []tasks.Definition, error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "config.yaml", "path of the config file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, err
		}
		return nil, nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, nil, usageError{fmt.Errorf("unexpected arguments %q (usage: worker [--config PATH])", fs.Args())}
	}
	cfg, err := config.LoadConfig(*configPath)
	if err != nil {
		return nil, nil, usageError{err}
	}
	handlers := tasks.All()
	var unknown []string // sorted, as TaskTypes is
	for _, typ := range cfg.TaskTypes() {
		if !slices.ContainsFunc(handlers, func(d tasks.Definition) bool { return d.Type == typ }) {
			unknown = append(unknown, typ)
		}
	}
	if len(unknown) > 0 {
		return nil, nil, usageError{fmt.Errorf("config: tasks: no handler in this worker for task types %q", unknown)}
	}
	return cfg, handlers, nil
}

// startError is a worker that did not start: bad input (exit 2) when the
// embedded Redis's file is unreadable or Redis holds another build's
// layout of fleetcap's keys.
func startError(err error) error {
	var fileErr *worker.EmbeddedFileError
	var layoutErr *worker.LayoutError
	if errors.As(err, &fileErr) || errors.As(err, &layoutErr) {
		return usageError{err}
	}
	return err
}

// printPages says where the worker's Redis and pages are; base is the
// monitoring server's URL.
func printPages(stdout io.Writer, cfg *config.Config, base string) {
	where := "embedded Redis at " + cfg.Redis.EmbeddedAddr
	if !cfg.Redis.Embedded() {
		where = "Redis from the config"
	}
	// One write: a reader that waits for the pages never sees half of it.
	banner := fmt.Sprintf("fleetcap worker on %s\n  semaphores: %s/semaphores\n  asynqmon:   %s/monitoring/\n  metrics:    %s/metrics\n",
		where, base, base, base)
	if cfg.Redis.Embedded() && cfg.Redis.EmbeddedFile != "" {
		banner += fmt.Sprintf("  kept in:    %s (saved at stop, loaded at start)\n", cfg.Redis.EmbeddedFile)
	}
	fmt.Fprint(stdout, banner)
}
