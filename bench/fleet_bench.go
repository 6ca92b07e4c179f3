package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/internal/testutil/fleettest"
	"github.com/fleetcap/fleetcap/internal/testutil/probeworker/probe"
	"github.com/fleetcap/fleetcap/producer"
)

// fleetRun is one run of probe workers on the bench Redis.
type fleetRun struct {
	env        *benchEnv
	queue      string
	config     string // the workers' config file
	dir        string // the run's directory, removed by stop
	procs      []*fleettest.Proc
	counters   *fleettest.Counters
	countRDB   *redis.Client
	mainRDB    *redis.Client
	client     *asynq.Client      // enqueues as a plain asynq client would
	producer   *producer.Producer // enqueues as the product does
	cmdsStart  int64
	cpuStart   time.Duration    // the Redis server's CPU time at markCommands
	statsStart map[string]int64 // with BENCH_CMDSTATS
}

// pids is the process IDs of the run's workers.
func (r *fleetRun) pids() []int {
	out := make([]int, len(r.procs))
	for i, p := range r.procs {
		out[i] = p.PID()
	}
	return out
}

// probeBinary builds the probe worker once per bench run, or takes the one
// BENCH_PROBE names (to compare two builds on the same machine minutes
// apart).
var probeBinary = sync.OnceValues(func() (string, error) {
	if path := os.Getenv("BENCH_PROBE"); path != "" {
		return path, nil
	}
	dir, err := os.MkdirTemp("", "fleetcap-bench-")
	if err != nil {
		return "", err
	}
	return fleettest.Build(dir, false)
})

// startFleetWith starts procs probe workers, with the probe type capped by
// capYAML and more top-level config sections (extraYAML, such as a
// semaphore section), on a queue of their own; counters live in a Redis of
// their own so that they do not count as the fleet's Redis commands.
func startFleetWith(env *benchEnv, name string, procs, concurrency int, capYAML, extraYAML string) (*fleetRun, error) {
	r, err := prepareFleet(env, name, concurrency, capYAML, extraYAML)
	if err != nil {
		return nil, err
	}
	if err := r.launch(procs); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// prepareFleet writes the config of a fleet run of the probe type, capped
// by capYAML, and opens its clients; its workers start with launch, so
// that a run can fill its queue first.
func prepareFleet(env *benchEnv, name string, concurrency int, capYAML, extraYAML string) (*fleetRun, error) {
	return prepareFleetTypes(env, name, concurrency, map[string]string{probe.Type: capYAML}, extraYAML)
}

// prepareFleetTypes is prepareFleet with several probe task types, each
// capped by its entry of capYAML (empty: uncapped), all on the run's queue.
func prepareFleetTypes(env *benchEnv, name string, concurrency int, capYAML map[string]string, extraYAML string) (*fleetRun, error) {
	queue := fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
	dir, err := os.MkdirTemp("", "fleetcap-bench-run-")
	if err != nil {
		return nil, err
	}
	p, path, err := writeFleetConfig(dir, fleettest.ConfigTypes("redis://"+env.addr, queue, concurrency, capYAML)+extraYAML, capYAML)
	if err != nil {
		_ = os.RemoveAll(dir) // nothing of the run is left to run
		return nil, err
	}
	r := &fleetRun{env: env, queue: queue, config: path, dir: dir, producer: p}
	r.mainRDB = redis.NewClient(&redis.Options{Addr: env.addr})
	r.countRDB = redis.NewClient(&redis.Options{Addr: env.counterAddr})
	r.counters = fleettest.NewCounters(r.countRDB, queue)
	r.client = asynq.NewClient(asynq.RedisClientOpt{Addr: env.addr, PoolSize: 32})
	return r, nil
}

// writeFleetConfig writes configYAML into dir and opens a producer on it
// that validates the probe types of capYAML.
func writeFleetConfig(dir, configYAML string, capYAML map[string]string) (*producer.Producer, string, error) {
	path, err := fleettest.WriteConfig(dir, configYAML)
	if err != nil {
		return nil, "", err
	}
	cfg, err := config.LoadConfig(path)
	if err != nil {
		return nil, "", err
	}
	var opts []producer.Option
	for typ := range capYAML {
		opts = append(opts, producer.WithValidator(typ, probe.Validate))
	}
	p, err := producer.New(cfg, opts...)
	return p, path, err
}

// launch starts procs probe workers with flags (such as --slots-waiting or
// --hold) added to their command lines.
func (r *fleetRun) launch(procs int, flags ...string) error {
	bin, err := probeBinary()
	if err != nil {
		return err
	}
	for i := range procs {
		args := append([]string{"--counters", "redis://" + r.env.counterAddr, "--prefix", r.queue}, flags...)
		p, err := fleettest.Start(bin, fmt.Sprintf("w%d", i), r.config, args...)
		if err != nil {
			return err
		}
		r.procs = append(r.procs, p)
	}
	return nil
}

// launchAtOnce starts procs probe workers that wait (--hold) until every
// one of them is ready, then lets them all serve, so that a run does not
// begin with a part of its fleet.
func (r *fleetRun) launchAtOnce(procs int, flags ...string) error {
	if err := r.launch(procs, append(flags, "--hold")...); err != nil {
		return err
	}
	for _, p := range r.procs {
		if err := p.Release(); err != nil {
			return err
		}
	}
	return nil
}

// enqueue adds n probes (payload from fn) with a plain asynq client, as a
// service that does not use package producer would.
func (r *fleetRun) enqueue(ctx context.Context, n int, payload func(i int) map[string]any) error {
	return inParallel(ctx, n, func(ctx context.Context, i int) error {
		b, _ := json.Marshal(payload(i))
		_, err := r.client.EnqueueContext(ctx, asynq.NewTask(probe.Type, b), asynq.Queue(r.queue))
		return err
	})
}

// produce adds n tasks of taskType (payload from fn) through the producer,
// as the product enqueues: a capped task whose cap has no place for it
// waits in the cap's waiting room, not in the queue.
func (r *fleetRun) produce(ctx context.Context, taskType string, n int, payload func(i int) map[string]any) error {
	return inParallel(ctx, n, func(ctx context.Context, i int) error {
		b, _ := json.Marshal(payload(i))
		_, err := r.producer.Enqueue(ctx, taskType, b)
		return err
	})
}

// inParallel runs do for 0..n-1 with up to 16 at once, and returns the
// first error.
func inParallel(ctx context.Context, n int, do func(ctx context.Context, i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error] // an atomic.Value would panic on a second error of another type
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || firstErr.Load() != nil {
					return
				}
				if err := do(ctx, i); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		return *err
	}
	return nil
}

func (r *fleetRun) markCommands(ctx context.Context) error {
	stats, err := commandStats(ctx, r.mainRDB)
	if err != nil {
		return err
	}
	r.cmdsStart = sum(stats)
	if r.cpuStart, err = serverCPU(ctx, r.mainRDB); err != nil {
		return err
	}
	if os.Getenv("BENCH_CMDSTATS") != "" {
		r.statsStart = stats
	}
	return nil
}

// commandsSinceMark is the commands the fleet's Redis ran since
// markCommands (but for the two INFO calls of markCommands). With
// BENCH_CMDSTATS set it also prints them by command to stderr.
func (r *fleetRun) commandsSinceMark(ctx context.Context) (int64, error) {
	now, err := commandStats(ctx, r.mainRDB)
	if err != nil {
		return 0, err
	}
	if r.statsStart != nil {
		var lines []string
		for name, calls := range now {
			d := calls - r.statsStart[name]
			if name == "info" {
				d -= 2 // markCommands' own
			}
			if d > 0 {
				lines = append(lines, fmt.Sprintf("%8d %s", d, name))
			}
		}
		slices.Sort(lines)
		fmt.Fprintf(os.Stderr, "%s commands:\n%s\n", r.queue, strings.Join(lines, "\n"))
	}
	return sum(now) - r.cmdsStart - 2, nil
}

// cpuPerTask is the Redis server's CPU time since markCommands, in
// microseconds for each of tasks (SPEC §4: redis_cpu_us_per_task).
func (r *fleetRun) cpuPerTask(ctx context.Context, tasks int) (float64, error) {
	now, err := serverCPU(ctx, r.mainRDB)
	if err != nil {
		return 0, err
	}
	return round(float64((now-r.cpuStart).Microseconds())/float64(tasks), 1), nil
}

// sum is the total of a command count map.
func sum(stats map[string]int64) int64 {
	var n int64
	for _, calls := range stats {
		n += calls
	}
	return n
}

func (r *fleetRun) wait(ctx context.Context, n int, within time.Duration) error {
	return r.counters.WaitDone(ctx, n, within, func() error {
		for _, p := range r.procs {
			if p.Exited() {
				return fmt.Errorf("%s exited: %s", p.Name, p.Log())
			}
		}
		return ctx.Err()
	})
}

func (r *fleetRun) stop() {
	var wg sync.WaitGroup
	for _, p := range r.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = p.Stop(15 * time.Second)
		}()
	}
	wg.Wait()
	if r.client != nil {
		_ = r.client.Close()
	}
	if r.producer != nil {
		_ = r.producer.Close()
	}
	if r.countRDB != nil {
		_ = r.countRDB.Close()
	}
	if r.mainRDB != nil {
		_ = r.mainRDB.Close()
	}
	if r.dir != "" {
		_ = os.RemoveAll(r.dir) // a temporary directory; a leftover harms nothing
	}
}

func capBlock(key string, capacity int, mode string) string {
	return fmt.Sprintf("    semaphore:\n      key: %q\n      capacity: %d\n      mode: %s\n      ttl: 30s\n      wait_timeout: 10s\n", key, capacity, mode)
}

// runS1 is fleet saturation: 3 processes x 10 share a cap of 5.
func runS1(ctx context.Context, env *benchEnv) error {
	const capacity, conc, tasks, dur = 5, 10, 400, 25
	procs, err := envCount("BENCH_S1_PROCS", 3) // e.g. 1: every hand-over inside one process
	if err != nil {
		return err
	}
	for _, mode := range []string{"requeue", "wait"} {
		r, err := prepareFleet(env, "s1-"+mode, conc, capBlock(fmt.Sprintf("s1-%s-%d", mode, time.Now().UnixNano()), capacity, mode), "")
		if err != nil {
			return err
		}
		// As in the BullMQ anchor, the tasks are enqueued before the
		// workers start: through the producer, so that the cap's places
		// go to the queue and the rest wait in the cap's waiting room.
		err = r.produce(ctx, probe.Type, tasks, func(int) map[string]any { return map[string]any{"ms": dur} })
		if err == nil {
			err = r.launch(procs)
		}
		if err == nil {
			err = r.wait(ctx, tasks, 2*time.Minute)
		}
		if err != nil {
			r.stop()
			return err
		}
		makespan, err := r.counters.Makespan(ctx)
		peak, perr := r.counters.MaxInflight(ctx)
		err = errors.Join(err, perr)
		var seatFields map[string]any
		if err == nil {
			seatFields, err = probeFields(ctx, r, dur)
		}
		r.stop()
		if err != nil {
			return err
		}
		ideal := float64(tasks*dur) / float64(min(capacity, procs*conc))
		ms := float64(makespan.Milliseconds())
		if err := env.emit(merge(map[string]any{
			"peer": "fleetcap", "scenario": "S1", "variant": mode, "cap": capacity, "workers": procs, "conc": conc,
			"tasks": tasks, "dur_ms": dur, "makespan_ms": int(ms), "utilization": round(ideal/ms, 3),
			"max_inflight": peak, "tasks_per_s": int(float64(tasks) / ms * 1000),
		}, seatFields)); err != nil {
			return err
		}
	}
	return nil
}

// probeFields are the probe's own share of a seat's time: the mean time a
// probe held its seat beyond its dur ms (a count-in slower than its work,
// its count-out and its timer's overshoot), and the utilization that
// leaves even if seats passed from one task to the next at no cost
// (dur / (dur + overhead)).
func probeFields(ctx context.Context, r *fleetRun, dur int) (map[string]any, error) {
	over, err := r.counters.ProbeOverhead(ctx)
	if err != nil {
		return nil, err
	}
	ms := float64(over.Microseconds()) / 1000
	return map[string]any{"probe_overhead_ms": round(ms, 2), "probe_ceiling": round(float64(dur)/(float64(dur)+ms), 3)}, nil
}

// merge adds the fields of more to m.
func merge(m map[string]any, more map[string]any) map[string]any {
	maps.Copy(m, more)
	return m
}

// runS2 is the cap's overhead: no-op tasks through one process of 20, with
// a cap of 1000 (never reached) and with no cap. On a small, shared machine
// one run of each moves by a fifth from run to run, so it runs s2Rounds
// rounds, capped then bare, and reports the median of each.
func runS2(ctx context.Context, env *benchEnv) error {
	const conc, tasks = 20, 20000
	rates := map[string][]float64{}
	ms := map[string][]int64{}
	cpu := map[string][]float64{}
	for range s2Rounds {
		for _, variant := range []string{"capped", "bare"} {
			makespan, cpuPerTask, err := runS2Once(ctx, env, variant, conc, tasks)
			if err != nil {
				return err
			}
			rates[variant] = append(rates[variant], float64(tasks)/makespan.Seconds())
			ms[variant] = append(ms[variant], makespan.Milliseconds())
			cpu[variant] = append(cpu[variant], cpuPerTask)
		}
	}
	for _, variant := range []string{"capped", "bare"} {
		each := make([]int, len(rates[variant]))
		for i, r := range rates[variant] {
			each[i] = int(r)
		}
		if err := env.emit(map[string]any{
			"peer": "fleetcap", "scenario": "S2", "variant": variant, "conc": conc, "tasks": tasks,
			"ms": median(ms[variant]), "tasks_per_s": int(median(rates[variant])), "tasks_per_s_each": each,
			"redis_cpu_us_per_task": median(cpu[variant]),
		}); err != nil {
			return err
		}
	}
	return env.emit(map[string]any{"peer": "fleetcap", "scenario": "S2", "variant": "ratio", "ratio": round(median(rates["capped"])/median(rates["bare"]), 3)})
}

// s2Rounds is how many times S2 runs each variant.
const s2Rounds = 3

// runS2Once runs one S2 variant and returns its makespan and the Redis
// server's CPU time a task (microseconds) from the worker's start.
func runS2Once(ctx context.Context, env *benchEnv, variant string, conc, tasks int) (time.Duration, float64, error) {
	capYAML := ""
	if variant == "capped" {
		capYAML = capBlock(fmt.Sprintf("s2-%d", time.Now().UnixNano()), 1000, "requeue")
	}
	r, err := prepareFleet(env, "s2-"+variant, conc, capYAML, "")
	if err != nil {
		return 0, 0, err
	}
	defer r.stop()
	// The queue is filled before the worker starts, so that the enqueuer
	// does not compete with it for the CPU.
	if err := r.enqueue(ctx, tasks, func(int) map[string]any { return map[string]any{"ms": 0} }); err != nil {
		return 0, 0, err
	}
	if err := r.markCommands(ctx); err != nil {
		return 0, 0, err
	}
	if err := r.launch(1); err != nil {
		return 0, 0, err
	}
	if err := r.wait(ctx, tasks, 5*time.Minute); err != nil {
		return 0, 0, err
	}
	cpu, err := r.cpuPerTask(ctx, tasks)
	if err != nil {
		return 0, 0, err
	}
	makespan, err := r.counters.Makespan(ctx)
	return makespan, cpu, err
}

// median is the middle value of xs (the mean of the two middle ones when
// there is an even number).
func median[T int64 | float64](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
