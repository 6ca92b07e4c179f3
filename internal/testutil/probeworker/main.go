// Command probeworker is a fleetcap worker for the fleet tests and the
// benchmarks: it serves the task type "probe", report:fetch (as the enqueue
// command makes it, counted the same way) and every other task type its
// config declares (such as "probe2" with caps of its own, or an uncapped
// "noop") under the caps of its config, and counts in Redis, independently
// of the semaphore, how many probes run at once (overall and per tenant),
// when the first started and the last ended, and which finished.
//
//	probeworker --config fleet.yaml [--counters redis://127.0.0.1:6379] [--prefix probe]
//	            [--slots-waiting] [--hold]
//
// With --slots-waiting it also counts the slots that hold a capped task
// which is not running, through the worker's Observer (see
// worker.Observer.Waiting): from when the task asks for its seat until it
// runs or goes back. The count out of a task that runs is a round trip made
// before its standby place goes to the next task, so that the fleet-wide
// count never shows both at once; that round trip is part of the seat's
// time, and is reported with the probe's overhead. With --hold it waits, once ready, for a line on its
// standard input before it serves, so that a whole fleet can start at once.
//
// Counters (all under the prefix's hash tag):
//
//	{P}:inflight, {P}:max            probes running now, and the most at once
//	{P}:inflight:pid:<pid>           probes running now in one process (a test
//	                                 that kills it counts them out)
//	{P}:inflight:<tenant>, {P}:tmax  the same per tenant (tmax is a hash)
//	{P}:inflight:type:<type>,        the same per task type
//	{P}:typemax
//	{P}:first, {P}:last              Unix ms of the first start and last end
//	{P}:first:<type>, {P}:last:<type>  the same for one task type
//	{P}:done                         a set of finished task IDs
//	{P}:runs                         how many runs finished (duplicates count)
//	{P}:overhead                     a hash: "us", the microseconds finished
//	                                 probes held their seats beyond their ms
//	                                 (counting in and out, and the timer's
//	                                 overshoot), and "n", how many of them
//	{P}:waiting, {P}:waiting:max     with --slots-waiting: slots holding a
//	                                 capped task that is not running, now and
//	                                 the most at once, fleet-wide
//	{P}:pickup                       a list: for each probe whose payload
//	                                 carries enqueued_us, the µs from its
//	                                 enqueue to its handler's start
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/internal/testutil/probeworker/probe"
	"github.com/fleetcap/fleetcap/semaphore"
	"github.com/fleetcap/fleetcap/tasks"
	"github.com/fleetcap/fleetcap/worker"
)

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
	slotsWaiting := flag.Bool("slots-waiting", false, "count the slots that hold a capped task which is not running")
	hold := flag.Bool("hold", false, "once ready, wait for a line on standard input before serving")
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
	cfg, err := config.LoadConfig(*configPath)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
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
	c := &counter{rdb: crdb, p: "{" + *prefix + "}:", pid: strconv.Itoa(os.Getpid())}
	opts := []worker.Option{worker.WithLogger(logger)}
	if *slotsWaiting {
		opts = append(opts, worker.WithObserver(&slotCounter{c: c, log: logger}))
	}
	w, err := worker.New(cfg, opts...)
	if err != nil {
		return err
	}
	w.HandleFunc(probe.Type, c.handle)
	w.HandleFunc(tasks.TypeReportFetch, c.handleReportFetch)
	for _, typ := range cfg.TaskTypes() {
		if typ != probe.Type && typ != tasks.TypeReportFetch {
			w.HandleFunc(typ, c.handle)
		}
	}
	fmt.Println("probeworker: ready")
	if *hold {
		if err := waitLine(ctx, os.Stdin); err != nil || ctx.Err() != nil {
			return err
		}
	}
	return w.Run(ctx)
}

// waitLine waits for a line (or the end) of in, or for ctx.
func waitLine(ctx context.Context, in *os.File) error {
	read := make(chan error, 1)
	go func() {
		_, err := bufio.NewReader(in).ReadString('\n')
		read <- err
	}()
	select {
	case <-ctx.Done():
		return nil // told to stop before serving
	case err := <-read:
		if err != nil {
			return fmt.Errorf("--hold: standard input: %w", err)
		}
		return nil
	}
}

type counter struct {
	rdb redis.UniversalClient
	p   string
	pid string
	// countOut is the count-out round trips (µs) not yet reported, made
	// while a seat was held: a probe's end script is only timed once it
	// has run, and the slot counter's count-out comes before the handler;
	// the next probe reports them.
	countOut atomic.Int64
}

// waitingScript counts a capped task in as it enters a slot, and keeps the
// most counted in at once.
//
// KEYS[1] the prefix; reply: the slots waiting now.
var waitingScript = redis.NewScript(`
local n = redis.call('INCR', KEYS[1] .. 'waiting')
local m = tonumber(redis.call('GET', KEYS[1] .. 'waiting:max') or '0')
if n > m then redis.call('SET', KEYS[1] .. 'waiting:max', n) end
return n`)

// slotCounter is the worker's Observer under --slots-waiting: it counts
// the slots that hold a capped task which is not running in {P}:waiting,
// and the most at once in {P}:waiting:max. Each count is a round trip, made
// before the worker goes on.
type slotCounter struct {
	c   *counter
	log *slog.Logger
	// seated counts the seats taken whose task has not been counted out
	// yet: only such a count-out is part of a seat's time.
	seated atomic.Int64
}

// Waiting counts a slot in or out.
func (sc *slotCounter) Waiting(_ string, delta int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var err error
	if delta > 0 {
		err = waitingScript.Run(ctx, sc.c.rdb, []string{sc.c.p}).Err()
	} else {
		start := time.Now()
		err = sc.c.rdb.Decr(ctx, sc.c.p+"waiting").Err()
		for n := sc.seated.Load(); n > 0; n = sc.seated.Load() {
			if sc.seated.CompareAndSwap(n, n-1) {
				sc.c.countOut.Add(time.Since(start).Microseconds()) // a seat is held meanwhile
				break
			}
		}
	}
	if err != nil {
		sc.log.Error("probeworker: count a slot waiting", "delta", delta, "err", err)
	}
}

func (*slotCounter) Acquire(semaphore.AcquireEvent) {}
func (*slotCounter) Release(semaphore.ReleaseEvent) {}
func (*slotCounter) Lost(string)                    {}

// ActiveChanged notes a seat taken.
func (sc *slotCounter) ActiveChanged(_ string, delta int) {
	if delta > 0 {
		sc.seated.Add(1)
	}
}
func (*slotCounter) Requeued(string, string, string) {}
func (*slotCounter) LeaseLost(string, string)        {}

// startScript counts a probe in: first start, in-flight counts and their
// peaks (overall, per task type, and per tenant when ARGV[2] is set). One
// round trip, made while the probe works, so that counting adds little to
// the time a seat is held.
//
// KEYS[1] the prefix
// ARGV[1] Unix ms now; ARGV[2] tenant or empty; ARGV[3] pid; ARGV[4] task type
// ARGV[5] µs since its enqueue, or empty
// ARGV[6] Unix µs now, kept in the list of starts (and, with a tenant,
// in the list of the tenants' starts)
var startScript = redis.NewScript(`
local now = tonumber(ARGV[1])
for _, k in ipairs({KEYS[1] .. 'first', KEYS[1] .. 'first:' .. ARGV[4]}) do
  local f = tonumber(redis.call('GET', k) or '')
  if f == nil or now < f then redis.call('SET', k, now) end
end
local n = redis.call('INCR', KEYS[1] .. 'inflight')
redis.call('INCR', KEYS[1] .. 'inflight:pid:' .. ARGV[3])
local m = tonumber(redis.call('GET', KEYS[1] .. 'max') or '0')
if n > m then redis.call('SET', KEYS[1] .. 'max', n) end
local yn = redis.call('INCR', KEYS[1] .. 'inflight:type:' .. ARGV[4])
local ym = tonumber(redis.call('HGET', KEYS[1] .. 'typemax', ARGV[4]) or '0')
if yn > ym then redis.call('HSET', KEYS[1] .. 'typemax', ARGV[4], yn) end
if ARGV[2] ~= '' then
  local tn = redis.call('INCR', KEYS[1] .. 'inflight:' .. ARGV[2])
  local tm = tonumber(redis.call('HGET', KEYS[1] .. 'tmax', ARGV[2]) or '0')
  if tn > tm then redis.call('HSET', KEYS[1] .. 'tmax', ARGV[2], tn) end
end
if ARGV[5] ~= '' then redis.call('RPUSH', KEYS[1] .. 'pickup', ARGV[5]) end
redis.call('RPUSH', KEYS[1] .. 'starts', ARGV[6])
if ARGV[2] ~= '' then redis.call('RPUSH', KEYS[1] .. 'tstarts', ARGV[2] .. '\t' .. ARGV[6]) end
return n`)

// endScript counts a probe out.
//
// KEYS[1] the prefix
// ARGV[1] Unix ms now; ARGV[2] tenant or empty; ARGV[3] '1' when it finished
// (not cancelled); ARGV[4] task ID; ARGV[5] pid; ARGV[6] the microseconds
// it held its seat beyond its ms (see overhead); ARGV[7] task type
var endScript = redis.NewScript(`
redis.call('DECR', KEYS[1] .. 'inflight')
redis.call('DECR', KEYS[1] .. 'inflight:pid:' .. ARGV[5])
redis.call('DECR', KEYS[1] .. 'inflight:type:' .. ARGV[7])
if ARGV[2] ~= '' then redis.call('DECR', KEYS[1] .. 'inflight:' .. ARGV[2]) end
if ARGV[3] == '1' then
  local now = tonumber(ARGV[1])
  for _, k in ipairs({KEYS[1] .. 'last', KEYS[1] .. 'last:' .. ARGV[7]}) do
    if now > tonumber(redis.call('GET', k) or '0') then redis.call('SET', k, now) end
  end
  redis.call('SADD', KEYS[1] .. 'done', ARGV[4])
  redis.call('INCR', KEYS[1] .. 'runs')
  redis.call('HINCRBY', KEYS[1] .. 'overhead', 'us', ARGV[6])
  redis.call('HINCRBY', KEYS[1] .. 'overhead', 'n', 1)
  if ARGV[2] ~= '' and now > tonumber(redis.call('HGET', KEYS[1] .. 'tlast', ARGV[2]) or '0') then
    redis.call('HSET', KEYS[1] .. 'tlast', ARGV[2], now)
  end
end
return 1`)

func (c *counter) handle(ctx context.Context, t *asynq.Task) error {
	p, err := probe.Decode(t.Payload())
	if err != nil {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return c.count(ctx, t.Type(), p)
}

// handleReportFetch counts report:fetch tasks (as the enqueue command makes
// them) like probes: they hold their seat for the payload's duration_ms.
func (c *counter) handleReportFetch(ctx context.Context, t *asynq.Task) error {
	rp, err := tasks.DecodeReportFetch(t.Payload())
	if err != nil {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return c.count(ctx, t.Type(), probe.Payload{MS: int(rp.Duration() / time.Millisecond)})
}

// count runs one probe: counted in, held for p.MS (or until ctx is done),
// counted out.
func (c *counter) count(ctx context.Context, taskType string, p probe.Payload) error {
	start := time.Now()
	id, _ := asynq.GetTaskID(ctx)
	bg := context.WithoutCancel(ctx)
	keys := []string{c.p}
	pickup := ""
	if p.EnqueuedUS > 0 {
		pickup = strconv.FormatInt(start.UnixMicro()-p.EnqueuedUS, 10)
	}
	// The count-in overlaps the work: its reply is awaited before the
	// count-out is sent, so both land while the seat is held.
	countedIn := make(chan error, 1)
	go func() {
		countedIn <- startScript.Run(bg, c.rdb, keys, start.UnixMilli(), p.Tenant, c.pid, taskType, pickup, start.UnixMicro()).Err()
	}()
	work := time.Duration(p.MS) * time.Millisecond
	var runErr error
	select {
	case <-time.After(work):
	case <-ctx.Done():
		runErr = ctx.Err()
	}
	if err := <-countedIn; err != nil {
		return err
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
	// What the probe itself adds to the seat's time: a count-in slower
	// than the work, the timer's overshoot, and (reported by the next
	// probe) counting out.
	ended := time.Now()
	overhead := ended.Sub(start) - work + time.Duration(c.countOut.Swap(0))*time.Microsecond
	if err := endScript.Run(bg, c.rdb, keys, ended.UnixMilli(), p.Tenant, finished, id, c.pid, overhead.Microseconds(), taskType).Err(); err != nil {
		return err
	}
	c.countOut.Add(time.Since(ended).Microseconds())
	if runErr != nil {
		return runErr
	}
	return nil
}
