// Command enqueue validates task payloads and enqueues them for a fleetcap
// fleet:
//
//	enqueue [--config PATH] [flags] TYPE [JSON]
//
// With JSON it enqueues that payload (--count times); without, it reads one
// JSON payload a line from stdin, validates them all and only then enqueues
// them. It prints one task ID a line. Exit codes: 0 done, 1 a runtime
// failure (Redis unreachable, enqueue failed), 2 bad input (flags, config,
// task type, payload): then nothing is enqueued; 2 too when a cap's
// max_waiting is reached (the message names the key): that task and the
// ones after it are not enqueued.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/producer"
)

func main() {
	// Connection errors are reported once, by run; go-redis would also log
	// every failed dial.
	redis.SetLogger(discardLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// discardLogger silences go-redis's internal log.
type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // something went wrong at run time
	exitUsage   = 2 // bad input; nothing was enqueued
	exitFull    = 2 // a cap's max_waiting is reached; the rest was not enqueued
)

// run is the whole command; it returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := enqueueCmd(ctx, args, stdin, stdout, stderr)
	code := exitCode(err)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stderr, "enqueue: %v\n", err)
	}
	return code
}

// exitCode decides the exit code of every outcome, in one place.
func exitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		return exitUsage
	case errors.Is(err, producer.ErrFull):
		return exitFull
	default:
		return exitFailure
	}
}

// usageError is bad input from the user: exit 2, nothing enqueued.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}
