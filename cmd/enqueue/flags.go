package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fleetcap/fleetcap/tasks"
)

// options are the parsed command line.
type options struct {
	configPath string
	queue      string
	in         time.Duration
	unique     time.Duration
	maxRetry   int
	timeout    time.Duration
	count      int
	set        map[string]bool // the flags given

	taskType string
	payload  *string // nil: read JSON lines from stdin
}

// parseArgs parses flags and arguments. Flags may come before or after
// TYPE and JSON; "--" ends the flags.
func parseArgs(args []string, stderr io.Writer) (*options, error) {
	o := &options{set: map[string]bool{}}
	fs := flag.NewFlagSet("enqueue", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.configPath, "config", "config.yaml", "the fleet's config `PATH`")
	fs.StringVar(&o.queue, "queue", "", "enqueue to `QUEUE` instead of the task type's configured queue")
	fs.DurationVar(&o.in, "in", 0, "process the tasks after `DURATION` (e.g. 10m)")
	fs.DurationVar(&o.unique, "unique", 0, "skip a task identical to one enqueued within `DURATION` (at least 1s)")
	fs.IntVar(&o.maxRetry, "max-retry", 0, "retry budget `N`, instead of the configured max_retry")
	fs.DurationVar(&o.timeout, "timeout", 0, "handler timeout `DURATION`, instead of the configured timeout")
	fs.IntVar(&o.count, "count", 1, "enqueue the JSON payload `N` times")
	fs.Usage = func() { usage(fs) }

	var positional []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &usageError{err: err} // the flag package printed the usage
		}
		rest = fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumedDashDash(args, rest) {
			positional = append(positional, rest...)
			break
		}
		positional = append(positional, rest[0])
		rest = rest[1:]
	}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })

	switch len(positional) {
	case 0:
		return nil, usagef("missing TYPE; run enqueue -h for help")
	case 1:
	case 2:
		o.payload = &positional[1]
	default:
		return nil, usagef("too many arguments %q: want TYPE [JSON] (quote the JSON)", positional[2:])
	}
	o.taskType = positional[0]
	return o, o.check()
}

// consumedDashDash reports whether the flag package stopped at a "--" just
// before rest.
func consumedDashDash(args, rest []string) bool {
	i := len(args) - len(rest)
	return i > 0 && args[i-1] == "--"
}

// check validates the flag values.
func (o *options) check() error {
	switch {
	case o.count < 1:
		return usagef("--count must be >= 1, got %d", o.count)
	case o.count > 1 && o.payload == nil:
		return usagef("--count needs a JSON argument; with stdin, repeat the lines instead")
	case o.set["max-retry"] && o.maxRetry < 0:
		return usagef("--max-retry must be >= 0, got %d", o.maxRetry)
	case o.set["timeout"] && o.timeout <= 0:
		return usagef("--timeout must be > 0, got %s", o.timeout)
	case o.in < 0:
		return usagef("--in must not be negative, got %s", o.in)
	case o.set["unique"] && o.unique < time.Second:
		return usagef("--unique must be at least 1s, got %s", o.unique)
	case o.set["queue"] && strings.TrimSpace(o.queue) == "":
		return usagef("--queue must not be empty")
	}
	return nil
}

func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprint(w, `usage: enqueue [--config PATH] [flags] TYPE [JSON]

Validates the JSON payload against TYPE and enqueues it with the queue,
max_retry and timeout configured for TYPE. Without JSON, reads one JSON
payload a line from stdin, validates every line, and only then enqueues.
Prints one task ID a line. Exit status 2 means bad input: nothing enqueued.

flags:
`)
	fs.PrintDefaults()
	fmt.Fprintln(w, "\ntask types:")
	for _, d := range tasks.All() {
		fmt.Fprintf(w, "  %-18s e.g. %s\n", d.Type, d.Example)
	}
}
