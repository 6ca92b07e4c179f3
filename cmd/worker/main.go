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
	w.Use(monitoring.TracingMiddleware(tp, monitoring.WithIsFailure(worker.IsFailure)))
	for _, d := range defs {
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
