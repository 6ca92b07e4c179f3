// Command bench runs fleetcap's benchmark scenarios (SPEC §4) against a real
// Redis and prints one JSON line per scenario and variant.
//
//	go run ./bench -redis 127.0.0.1:6379 -scenarios S3,S4
//
// Without -redis (or REDIS_ADDR) it starts a private redis-server.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/redis/go-redis/v9"
)

func main() {
	// SIGPIPE too: a reader that stops early (a pipe into head) would
	// otherwise kill the bench before it stops its private redis-servers;
	// with it, the next line written fails and the run unwinds.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// scenario runs one benchmark and emits its JSON lines.
type scenario func(ctx context.Context, env *benchEnv) error

type benchEnv struct {
	addr        string // the Redis under test
	counterAddr string // a Redis of the bench's own for the probes' counters
	out         io.Writer
}

func (e *benchEnv) client() *redis.Client {
	// RESP2, as fleetcap's worker configures its clients (README: using
	// the semaphore with your own go-redis client).
	return redis.NewClient(&redis.Options{Addr: e.addr, PoolSize: 64, Protocol: 2})
}

// emit prints one JSON line.
func (e *benchEnv) emit(fields map[string]any) error {
	b, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(e.out, string(b))
	return err
}

var scenarios = map[string]scenario{
	"S1":  runS1,
	"S2":  runS2,
	"S3":  runS3,
	"S4":  runS4,
	"S5":  runS5,
	"S6":  runS6,
	"S7":  runS7,
	"S8":  runS8,
	"S9":  runS9,
	"S10": runS10,
}

// defaultScenarios are the scenarios a run without -scenarios runs.
const defaultScenarios = "S1,S2,S3,S4,S5,S6,S7,S8,S9,S10"

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	addr := fs.String("redis", os.Getenv("REDIS_ADDR"), "Redis host:port; empty starts a private redis-server")
	list := fs.String("scenarios", defaultScenarios, "comma-separated scenarios to run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *addr == "" {
		a, stopRedis, err := redistest.StartDetached()
		if err != nil {
			return err
		}
		defer stopRedis()
		*addr = a
	}
	counterAddr, stopCounters, err := redistest.StartDetached()
	if err != nil {
		return err
	}
	defer stopCounters()
	env := &benchEnv{addr: *addr, counterAddr: counterAddr, out: out}
	for _, name := range strings.Split(*list, ",") {
		name = strings.TrimSpace(name)
		sc, ok := scenarios[name]
		if !ok {
			return fmt.Errorf("unknown scenario %q", name)
		}
		if err := sc(ctx, env); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// commandCount is the total of calls in INFO commandstats.
func commandCount(ctx context.Context, rdb *redis.Client) (int64, error) {
	stats, err := commandStats(ctx, rdb)
	return sum(stats), err
}

// commandStats is the calls per command in INFO commandstats.
func commandStats(ctx context.Context, rdb *redis.Client) (map[string]int64, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		if j := strings.IndexByte(rest, ','); j >= 0 {
			rest = rest[:j]
		}
		n, err := strconv.ParseInt(rest, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("commandstats: %q: %w", line, err)
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out, nil
}

// serverCPU is the CPU time the Redis server has used since it started
// (INFO CPU: used_cpu_sys + used_cpu_user).
func serverCPU(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_sys" && name != "used_cpu_user") {
			continue
		}
		secs, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %q: %w", line, err)
		}
		total += secs
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu: used_cpu_sys and used_cpu_user not both found in %q", info)
	}
	return time.Duration(total * float64(time.Second)), nil
}

// envCount reads a positive count from the environment variable name, def
// when it is unset.
func envCount(name string, def int) (int, error) {
	return envInt(name, def, 1)
}

// envInt reads a whole number of at least lowest from the environment
// variable name, def when it is unset.
func envInt(name string, def, lowest int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lowest {
		return 0, fmt.Errorf("%s=%q: want a whole number of %d or more", name, v, lowest)
	}
	return n, nil
}
