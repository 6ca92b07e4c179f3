// Command probeworker is a fleetcap worker for the fleet tests and the
// benchmarks: it serves the task type "probe", report:fetch (as the enqueue
// command makes it, counted the same way) and every other task type its
// config declares (such as "probe2" with caps of its own) under the caps of
// its config, and counts in Redis, independently of the semaphore, how many
// probes run at once (overall and per tenant), when the first started and
// the last ended, and which finished.
//
//	probeworker --config fleet.yaml [--counters redis://127.0.0.1:6379] [--prefix probe]
//
// Counters (all under the prefix's hash tag):
//
//	{P}:inflight, {P}:max            probes running now, and the most at once
//	{P}:inflight:pid:<pid>           probes running now in one process (a test
//	                                 that kills it counts them out)
//	{P}:inflight:<tenant>, {P}:tmax  the same per tenant (tmax is a hash)
//	{P}:first, {P}:last              Unix ms of the first start and last end
//	{P}:done                         a set of finished task IDs
//	{P}:runs                         how many runs finished (duplicates count)
//	{P}:overhead                     a hash: "us", the microseconds finished
//	                                 probes held their seats beyond their ms
//	                                 (counting in and out, and the timer's
//	                                 overshoot), and "n", how many of them
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/tasks"
	"github.com/fleetcap/fleetcap/worker"
)

// TypeProbe is the probe task type.
const TypeProbe = "probe"

// Payload is a probe's payload.
type Payload struct {
	MS     int    `json:"ms"`               // how long the probe holds its seat
	Tenant string `json:"tenant,omitempty"` // counted per tenant when set
	Fail   bool   `json:"fail,omitempty"`   // fail (once per task) to exercise retries
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "probeworker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	configPath := flag.String("config", "config.yaml", "config file")
	counters := flag.String("counters", "", "redis:// URL of the counters' Redis; default the worker's")
	prefix := flag.String("prefix", "probe", "counter key prefix")
	cpuProfile := flag.String("cpuprofile", os.Getenv("PROBE_CPUPROFILE"), "write a CPU profile here (for the benchmarks)")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", *cpuProfile, os.Getpid()))
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	cfg, err := worker.LoadConfig(*configPath)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	w, err := worker.New(cfg, worker.WithLogger(logger))
	if err != nil {
		return err
	}
	var crdb redis.UniversalClient
	if *counters != "" {
		opt, err := redis.ParseURL(*counters)
		if err != nil {
			return err
		}
		crdb = redis.NewClient(opt)
	} else if crdb, err = cfg.Redis.NewClient(); err != nil {
		return err
	}
	defer crdb.Close()
	c := &counter{rdb: crdb, p: "{" + *prefix + "}:"}
	w.HandleFunc(TypeProbe, c.handle)
	w.HandleFunc(tasks.TypeReportFetch, c.handleReportFetch)
	for _, typ := range cfg.TaskTypes() {
		if typ != TypeProbe && typ != tasks.TypeReportFetch {
			w.HandleFunc(typ, c.handle)
		}
	}
	fmt.Println("probeworker: ready")
	return w.Run(ctx)
}

type counter struct {
	rdb redis.UniversalClient
	p   string
	// countOut is the last count-out round trip (µs) not yet reported:
	// a probe's own is only known once its end script has run, so the
	// next probe reports it.
	countOut atomic.Int64
}

// startScript counts a probe in: first start, in-flight counts and their
// peaks (overall, and per tenant when ARGV[2] is set). One round trip, so
// that counting adds little to the time a seat is held.
var startScript = redis.NewScript(`
redis.call('SETNX', KEYS[1] .. 'first', ARGV[1])
local n = redis.call('INCR', KEYS[1] .. 'inflight')
redis.call('INCR', KEYS[1] .. 'inflight:pid:' .. ARGV[3])
local m = tonumber(redis.call('GET', KEYS[1] .. 'max') or '0')
if n > m then redis.call('SET', KEYS[1] .. 'max', n) end
if ARGV[2] ~= '' then
  local tn = redis.call('INCR', KEYS[1] .. 'inflight:' .. ARGV[2])
  local tm = tonumber(redis.call('HGET', KEYS[1] .. 'tmax', ARGV[2]) or '0')
  if tn > tm then redis.call('HSET', KEYS[1] .. 'tmax', ARGV[2], tn) end
end
return n`)

// endScript counts a probe out; ARGV[3] = 1 when it finished (not
// cancelled), ARGV[6] the microseconds it held its seat beyond its ms (see
// overhead).
var endScript = redis.NewScript(`
redis.call('DECR', KEYS[1] .. 'inflight')
redis.call('DECR', KEYS[1] .. 'inflight:pid:' .. ARGV[5])
if ARGV[2] ~= '' then redis.call('DECR', KEYS[1] .. 'inflight:' .. ARGV[2]) end
if ARGV[3] == '1' then
  redis.call('SET', KEYS[1] .. 'last', ARGV[1])
  redis.call('SADD', KEYS[1] .. 'done', ARGV[4])
  redis.call('INCR', KEYS[1] .. 'runs')
  redis.call('HINCRBY', KEYS[1] .. 'overhead', 'us', ARGV[6])
  redis.call('HINCRBY', KEYS[1] .. 'overhead', 'n', 1)
end
return 1`)

func (c *counter) handle(ctx context.Context, t *asynq.Task) error {
	var p Payload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return fmt.Errorf("probe payload: %v: %w", err, asynq.SkipRetry)
	}
	return c.count(ctx, p)
}

// handleReportFetch counts report:fetch tasks (as the enqueue command makes
// them) like probes: they hold their seat for the payload's duration_ms.
func (c *counter) handleReportFetch(ctx context.Context, t *asynq.Task) error {
	rp, err := tasks.DecodeReportFetch(t.Payload())
	if err != nil {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return c.count(ctx, Payload{MS: int(rp.Duration() / time.Millisecond)})
}

// count runs one probe: counted in, held for p.MS (or until ctx is done),
// counted out.
func (c *counter) count(ctx context.Context, p Payload) error {
	id, _ := asynq.GetTaskID(ctx)
	bg := context.WithoutCancel(ctx)
	keys := []string{c.p}
	start := time.Now()
	if err := startScript.Run(bg, c.rdb, keys, start.UnixMilli(), p.Tenant, os.Getpid()).Err(); err != nil {
		return err
	}
	work := time.Duration(p.MS) * time.Millisecond
	var runErr error
	select {
	case <-time.After(work):
	case <-ctx.Done():
		runErr = ctx.Err()
	}
	if runErr == nil && p.Fail {
		if retried, _ := asynq.GetRetryCount(ctx); retried == 0 {
			runErr = fmt.Errorf("probe: asked to fail once")
		}
	}
	finished := "0"
	if runErr == nil {
		finished = "1"
	}
	// What the probe itself adds to the seat's time: counting in, the
	// timer's overshoot, and (reported by the next probe) counting out.
	ended := time.Now()
	overhead := ended.Sub(start) - work + time.Duration(c.countOut.Swap(0))*time.Microsecond
	if err := endScript.Run(bg, c.rdb, keys, ended.UnixMilli(), p.Tenant, finished, id, os.Getpid(), overhead.Microseconds()).Err(); err != nil {
		return err
	}
	c.countOut.Add(time.Since(ended).Microseconds())
	if runErr != nil {
		return runErr
	}
	return nil
}
