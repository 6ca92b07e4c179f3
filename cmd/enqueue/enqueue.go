package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/fleetcap/fleetcap/tasks"
	"github.com/fleetcap/fleetcap/worker"
	"github.com/hibiken/asynq"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// enqueueCmd validates everything, then enqueues.
func enqueueCmd(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	o, err := parseArgs(args, stderr)
	if err != nil {
		return err
	}
	cfg, err := worker.LoadConfig(o.configPath)
	if err != nil {
		return &usageError{err: err}
	}
	def, ok := tasks.Lookup(o.taskType)
	if !ok {
		return usagef("unknown task type %q; known types: %s", o.taskType, strings.Join(knownTypes(), ", "))
	}
	taskCfg, declared := cfg.Tasks[o.taskType]
	if !declared {
		fmt.Fprintf(stderr, "enqueue: warning: %s is not declared in %s: it runs on queue %q without a fleet-wide cap\n",
			o.taskType, o.configPath, worker.DefaultQueue)
	}
	opts, err := taskOptions(o, cfg, taskCfg, declared)
	if err != nil {
		return err
	}

	checker := payloadChecker{def: def, caps: taskCfg.Caps()}
	var payloads [][]byte
	switch {
	case o.payload != nil:
		p, err := argPayload(checker, *o.payload)
		if err != nil {
			return err
		}
		for range o.count {
			payloads = append(payloads, p)
		}
	case isTerminal(stdin):
		return usagef("missing JSON: give it as an argument, or pipe JSON lines on stdin")
	default:
		if payloads, err = stdinPayloads(checker, stdin); err != nil {
			return err
		}
	}

	connOpt, err := cfg.Redis.AsynqConnOpt()
	if err != nil {
		return &usageError{err: err}
	}
	client := asynq.NewClient(connOpt)
	defer client.Close()
	if err := client.Ping(); err != nil {
		if cfg.Redis.Embedded() {
			return fmt.Errorf("cannot reach the embedded Redis at %s (it runs inside the worker: is a worker running?): %w", cfg.Redis.EmbeddedAddr, err)
		}
		return fmt.Errorf("cannot reach Redis: %w", err)
	}
	return enqueueAll(ctx, client, o.taskType, payloads, opts, stdout, stderr)
}

// taskOptions builds the asynq options: the task type's configuration, then
// the flags.
func taskOptions(o *options, cfg *worker.Config, tc worker.TaskConfig, declared bool) ([]asynq.Option, error) {
	queue, maxRetry, timeout := worker.DefaultQueue, worker.DefaultMaxRetry, worker.DefaultTaskTimeout
	if declared {
		queue, maxRetry, timeout = tc.Queue, *tc.MaxRetry, tc.Timeout
	}
	if o.set["queue"] {
		queue = o.queue
	}
	if _, ok := cfg.Worker.Queues[queue]; !ok {
		var served []string
		for q := range cfg.Worker.Queues {
			served = append(served, q)
		}
		slices.Sort(served)
		return nil, usagef("queue %q is not served by the fleet (worker.queues in %s: %s)", queue, o.configPath, strings.Join(served, ", "))
	}
	if o.set["max-retry"] {
		maxRetry = o.maxRetry
	}
	if o.set["timeout"] {
		timeout = o.timeout
	}
	opts := []asynq.Option{asynq.Queue(queue), asynq.MaxRetry(maxRetry), asynq.Timeout(timeout)}
	if o.in > 0 {
		opts = append(opts, asynq.ProcessIn(o.in))
	}
	if o.unique > 0 {
		opts = append(opts, asynq.Unique(o.unique))
	}
	return opts, nil
}

// enqueueAll enqueues the payloads in order and prints each task ID. With
// --unique, a duplicate is reported on stderr and skipped.
func enqueueAll(ctx context.Context, client *asynq.Client, taskType string, payloads [][]byte, opts []asynq.Option, stdout, stderr io.Writer) error {
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
	enqueued, duplicates := 0, 0
	for i, p := range payloads {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("stopped after enqueueing %d of %d tasks: %w", enqueued, len(payloads), err)
		}
		id, err := enqueueOne(ctx, client, taskType, p, opts)
		switch {
		case errors.Is(err, asynq.ErrDuplicateTask):
			duplicates++
			if bar == nil {
				fmt.Fprintf(stderr, "enqueue: task %d of %d: a duplicate within --unique, skipped\n", i+1, len(payloads))
			}
		case err != nil:
			return fmt.Errorf("enqueued %d of %d tasks, then: %w", enqueued, len(payloads), err)
		default:
			enqueued++
			if _, err := fmt.Fprintln(stdout, id); err != nil {
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

// enqueueOne enqueues one task and returns its ID.
func enqueueOne(ctx context.Context, client *asynq.Client, taskType string, payload []byte, opts []asynq.Option) (id string, err error) {
	// Task headers travel with the task to the worker.
	// HOOK(monitoring): inject the producer span's traceparent here.
	headers := map[string]string{}

	info, err := client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(taskType, payload, headers), opts...)
	if err != nil {
		return "", fmt.Errorf("enqueue %s: %w", taskType, err)
	}
	return info.ID, nil
}

// isTerminal reports whether f (os.Stdin, os.Stderr) is a terminal.
func isTerminal(f any) bool {
	fd, ok := f.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(fd.Fd()))
}

func knownTypes() []string {
	var types []string
	for _, d := range tasks.All() {
		types = append(types, d.Type)
	}
	return types
}
