package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/probeworker/probe"
)

// runS8 is rate-limit accuracy: 3 processes of 10 slots share a limit of
// 200 tasks a second with a burst of 10, over 3,000 no-op tasks enqueued
// first (through the producer). It prints the achieved rate (first start
// to last), the most starts in any sliding second (at most rate + burst =
// 210 is the promise), and the fleet's Redis commands per task from the
// workers' start to the last task (as the BullMQ anchor counts), and from
// before the enqueue (redis_cmds_per_task_with_enqueue: the producer parks
// the tasks it holds back in the rate limit's room as it enqueues them).
//
// BENCH_S8_TEMPLATE=1 declares the limit's key as a template over the
// payload (one tenant), which prints variant "template".
func runS8(ctx context.Context, env *benchEnv) error {
	const procs, conc, tasks, rate, burst = 3, 10, 3000, 200, 10
	key, variant := fmt.Sprintf("s8-%d", time.Now().UnixNano()), "plain"
	if os.Getenv("BENCH_S8_TEMPLATE") == "1" {
		key, variant = key+":{tenant}", "template"
	}
	block := fmt.Sprintf("    rate_limits:\n      - {key: %q, rate: %d, per: 1s, burst: %d}\n", key, rate, burst)
	r, err := prepareFleetTypes(env, "s8", conc, map[string]string{probe.Type: block}, "")
	if err != nil {
		return err
	}
	defer r.stop()
	before, err := commandStats(ctx, r.mainRDB)
	if err != nil {
		return err
	}
	if err := r.produce(ctx, probe.Type, tasks, func(int) map[string]any { return map[string]any{"ms": 0, "tenant": "t1"} }); err != nil {
		return err
	}
	if err := r.markCommands(ctx); err != nil {
		return err
	}
	if err := r.launchAtOnce(procs); err != nil {
		return err
	}
	if err := r.wait(ctx, tasks, 2*time.Minute); err != nil {
		return err
	}
	cmds, err := r.commandsSinceMark(ctx)
	if err != nil {
		return err
	}
	enqueueCmds := r.cmdsStart - sum(before) - 1 // but this INFO
	cpu, err := r.cpuPerTask(ctx, tasks)
	if err != nil {
		return err
	}
	starts, err := r.counters.Starts(ctx)
	if err != nil {
		return err
	}
	if len(starts) < tasks {
		return fmt.Errorf("%d starts recorded for %d tasks", len(starts), tasks)
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	most, j := 0, 0
	for i := range starts {
		for starts[i].Sub(starts[j]) >= time.Second {
			j++
		}
		most = max(most, i-j+1)
	}
	span := starts[len(starts)-1].Sub(starts[0])
	return env.emit(map[string]any{
		"peer": "fleetcap", "scenario": "S8", "variant": variant, "rate": rate, "per_ms": 1000, "burst": burst,
		"workers": procs, "conc": conc, "tasks": tasks, "ms": span.Milliseconds(),
		"tasks_per_s": int(float64(len(starts)-1) / span.Seconds()), "max_in_any_1s": most,
		"redis_cmds_per_task": round(float64(cmds)/tasks, 2), "redis_cpu_us_per_task": cpu,
		"redis_cmds_per_task_with_enqueue": round(float64(cmds+enqueueCmds)/tasks, 2),
	})
}
