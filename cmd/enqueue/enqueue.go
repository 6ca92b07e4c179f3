package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hibiken/asynq"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/monitoring"
	"github.com/fleetcap/fleetcap/producer"
	"github.com/fleetcap/fleetcap/tasks"
)

// enqueueCmd validates everything, then enqueues through package producer.
func enqueueCmd(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (err error) {
	o, err := parseArgs(args, stderr)
	if err != nil {
		return err
	}
	cfg, err := config.LoadConfig(o.configPath)
	if err != nil {
		return &usageError{err: err}
	}
	tp, shutdownTracing, err := monitoring.SetupTracing(ctx, "fleetcap-enqueue")
	if err != nil {
		return &usageError{err: err}
	}
	defer func() {
		// Flushes the producer spans; a failure loses them, so say so.
		if serr := shutdownTracing(context.Background()); serr != nil {
			fmt.Fprintln(stderr, "enqueue: tracing shutdown:", serr)
		}
	}()
	p, err := producer.New(cfg, append(demoValidators(cfg), producer.WithTracerProvider(tp))...)
	if err != nil {
		return &usageError{err: err}
	}
	defer p.Close()

	opts := o.taskOptions()
	if err := p.CheckType(o.taskType, opts...); err != nil {
		return &usageError{err: fmt.Errorf("%w (in %s)", err, o.configPath)}
	}
	check := func(payload []byte) error { return p.Check(o.taskType, payload, opts...) }
	var payloads [][]byte
	switch {
	case o.payload != nil:
		payload, err := argPayload(check, *o.payload)
		if err != nil {
			return err
		}
		for range o.count {
			payloads = append(payloads, payload)
		}
	case isTerminal(stdin):
		return usagef("missing JSON: give it as an argument, or pipe JSON lines on stdin")
	default:
		if payloads, err = stdinPayloads(check, stdin); err != nil {
			return err
		}
	}

	if err := p.Ping(); err != nil {
		if cfg.Redis.Embedded() {
			return fmt.Errorf("cannot reach the embedded Redis at %s (it runs inside the worker: is a worker running?): %w", cfg.Redis.EmbeddedAddr, err)
		}
		return fmt.Errorf("cannot reach Redis: %w", err)
	}
	return enqueueAll(ctx, p, o.taskType, payloads, opts, stdout, stderr)
}

// demoValidators check the payloads of the demo task types of package
// tasks (the workers of cmd/worker run their handlers) that cfg declares;
// a type cfg does not declare cannot be enqueued, so it gets none.
func demoValidators(cfg *config.Config) []producer.Option {
	var opts []producer.Option
	for _, d := range tasks.All() {
		if _, declared := cfg.Tasks[d.Type]; declared {
			opts = append(opts, producer.WithValidator(d.Type, d.Validate))
		}
	}
	return opts
}

// taskOptions are the asynq options the flags ask for; the producer puts
// them after the task type's configured queue, max_retry and timeout.
func (o *options) taskOptions() []asynq.Option {
	var opts []asynq.Option
	if o.set["queue"] {
		opts = append(opts, asynq.Queue(o.queue))
	}
	if o.set["max-retry"] {
		opts = append(opts, asynq.MaxRetry(o.maxRetry))
	}
	if o.set["timeout"] {
		opts = append(opts, asynq.Timeout(o.timeout))
	}
	if o.in > 0 {
		opts = append(opts, asynq.ProcessIn(o.in))
	}
	if o.unique > 0 {
		opts = append(opts, asynq.Unique(o.unique))
	}
	return opts
}

// enqueueAll enqueues the payloads in order and prints each task ID. With
// --unique, a duplicate is reported on stderr and skipped.
func enqueueAll(ctx context.Context, p *producer.Producer, taskType string, payloads [][]byte, opts []asynq.Option, stdout, stderr io.Writer) error {
	var bar *progressbar.ProgressBar
	if len(payloads) > 1 && isTerminal(stderr) {
		bar = progressbar.NewOptions(len(payloads),
			progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("enqueue "+taskType),
			progressbar.OptionShowCount(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
		defer bar.Exit()
	}
	i, enqueued, duplicates := 0, 0, 0
	for info, err := range p.EnqueueAll(ctx, taskType, payloads, opts...) {
		i++
		switch {
		case errors.Is(err, asynq.ErrDuplicateTask):
			duplicates++
			if bar == nil {
				fmt.Fprintf(stderr, "enqueue: task %d of %d: a duplicate within --unique, skipped\n", i, len(payloads))
			}
		case errors.Is(err, producer.ErrInvalid):
			return &usageError{err: err} // not expected: every payload was checked
		case errors.Is(err, producer.ErrFull) && len(payloads) == 1:
			return fmt.Errorf("not enqueued: %w", err)
		case errors.Is(err, producer.ErrFull):
			return fmt.Errorf("enqueued %d of %d tasks, then stopped: %w", enqueued, len(payloads), err)
		case err != nil && ctx.Err() != nil:
			return fmt.Errorf("stopped after enqueueing %d of %d tasks: %w", enqueued, len(payloads), err)
		case err != nil:
			return fmt.Errorf("enqueued %d of %d tasks, then: %w", enqueued, len(payloads), err)
		default:
			enqueued++
			if _, err := fmt.Fprintln(stdout, info.ID); err != nil {
				return fmt.Errorf("write task ID: %w", err)
			}
		}
		if bar != nil {
			_ = bar.Add(1)
		}
	}
	if bar != nil {
		_ = bar.Finish()
	}
	if duplicates > 0 {
		fmt.Fprintf(stderr, "enqueue: %d enqueued, %d duplicates skipped\n", enqueued, duplicates)
	}
	return nil
}

// isTerminal reports whether f (os.Stdin, os.Stderr) is a terminal.
func isTerminal(f any) bool {
	fd, ok := f.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(fd.Fd()))
}
