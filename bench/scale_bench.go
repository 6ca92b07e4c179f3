package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/probeworker/probe"
)

// typeNoop is S7's uncapped task type, served by the probe worker beside
// the capped probe type in the same queue.
const typeNoop = "noop"

// runS7 is mixed load at fleet scale: 20 processes of 10 slots, 20,000
// uncapped no-op tasks alone, and beside a capped backlog (cap 5, 2,000
// tasks of 10 ms) in the same queue. The backlog waits in the cap's
// waiting room, not in slots, so the uncapped tasks should flow about as
// fast beside it as alone (ratio = beside/alone). One run of each moves by
// a tenth or more on a small, shared machine, so it runs s7Rounds rounds,
// alone then beside, and reports the median of each (as S2 does).
func runS7(ctx context.Context, env *benchEnv) error {
	sc := s7Params{procs: 20, conc: 10, capacity: 5, capped: 2000, dur: 10, uncapped: 20000}
	rounds, err := envCount("BENCH_S7_ROUNDS", s7Rounds)
	if err != nil {
		return err
	}
	variants := []string{"alone", "beside"}
	lines := map[string][]map[string]any{}
	rates := map[string][]float64{}
	for range rounds {
		for _, variant := range variants {
			key := fmt.Sprintf("s7-%s-%d", variant, time.Now().UnixNano())
			r, err := prepareFleetTypes(env, "s7-"+variant, sc.conc, map[string]string{
				probe.Type: capBlock(key, sc.capacity, "requeue"),
				typeNoop:   "",
			}, "")
			if err != nil {
				return err
			}
			line, rate, err := sc.run(ctx, r, variant)
			r.stop()
			if err != nil {
				return err
			}
			lines[variant] = append(lines[variant], line)
			rates[variant] = append(rates[variant], rate)
		}
	}
	for _, variant := range variants {
		// The round whose rate is the median (the lower of the middle two
		// for an even count) gives the line's other fields;
		// max_slots_waiting is the most of any round.
		order := make([]int, rounds)
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int { return cmp.Compare(rates[variant][a], rates[variant][b]) })
		each, waiting := make([]int, rounds), 0
		for i, rate := range rates[variant] {
			each[i] = int(rate)
			waiting = max(waiting, lines[variant][i]["max_slots_waiting"].(int))
		}
		if err := env.emit(merge(lines[variant][order[(rounds-1)/2]], map[string]any{
			"peer": "fleetcap", "scenario": "S7", "variant": variant, "workers": sc.procs, "conc": sc.conc,
			"uncapped_tasks": sc.uncapped, "uncapped_tasks_per_s": int(median(rates[variant])),
			"uncapped_tasks_per_s_each": each, "max_slots_waiting": waiting,
		})); err != nil {
			return err
		}
	}
	return env.emit(map[string]any{"peer": "fleetcap", "scenario": "S7", "variant": "ratio", "ratio": round(median(rates["beside"])/median(rates["alone"]), 3)})
}

// s7Rounds is how many times S7 runs each variant.
const s7Rounds = 3

// s7Params are S7's parameters: the fleet, the capped backlog (capped
// tasks of dur ms under a cap of capacity) and the uncapped no-ops.
type s7Params struct {
	procs, conc, capacity, capped, dur, uncapped int
}

// run runs one S7 variant on a prepared fleet: the queue is filled first
// (the capped backlog through the producer when beside, then the uncapped
// tasks), then the whole fleet starts at once. It returns the variant's
// fields and its uncapped tasks per second.
func (sc s7Params) run(ctx context.Context, r *fleetRun, variant string) (map[string]any, float64, error) {
	capped, dur, uncapped := sc.capped, sc.dur, sc.uncapped
	total := uncapped
	if variant == "beside" {
		total += capped
		if err := r.produce(ctx, probe.Type, capped, func(int) map[string]any { return map[string]any{"ms": dur} }); err != nil {
			return nil, 0, err
		}
	}
	if err := r.produce(ctx, typeNoop, uncapped, func(int) map[string]any { return map[string]any{"ms": 0} }); err != nil {
		return nil, 0, err
	}
	if err := r.markCommands(ctx); err != nil {
		return nil, 0, err
	}
	if err := r.launchAtOnce(sc.procs, "--slots-waiting"); err != nil {
		return nil, 0, err
	}
	if err := r.wait(ctx, total, 5*time.Minute); err != nil {
		return nil, 0, err
	}
	cmds, err := r.commandsSinceMark(ctx)
	if err != nil {
		return nil, 0, err
	}
	span, err := r.counters.MakespanOf(ctx, typeNoop)
	if err != nil {
		return nil, 0, err
	}
	waiting, err := r.counters.MaxSlotsWaiting(ctx)
	if err != nil {
		return nil, 0, err
	}
	rate := float64(uncapped) / span.Seconds()
	// The commands of the whole run (from the workers' start to the last
	// task's end), per task of either type.
	line := map[string]any{"uncapped_ms": span.Milliseconds(), "max_slots_waiting": waiting,
		"redis_cmds_per_task": round(float64(cmds)/float64(total), 2)}
	if variant == "beside" {
		cspan, err := r.counters.MakespanOf(ctx, probe.Type)
		if err != nil {
			return nil, 0, err
		}
		peaks, err := r.counters.MaxInflightPerType(ctx)
		if err != nil {
			return nil, 0, err
		}
		// The backlog's own figures, to read the ratio by: how busy it
		// kept its cap meanwhile.
		line["capped_tasks"], line["cap"], line["dur_ms"] = capped, sc.capacity, dur
		line["capped_ms"] = cspan.Milliseconds()
		line["capped_utilization"] = round(float64(capped*dur)/float64(sc.capacity)/float64(cspan.Milliseconds()), 3)
		line["max_inflight"] = peaks[probe.Type] // of the capped type
	}
	return line, rate, nil
}

// runS9 is the idle fleet and its pickup: 20 processes of 10 slots wait on
// an empty queue for 5 s (the Redis commands they cost meanwhile, all
// together), then 200 tasks of 1 ms are enqueued 10 ms apart (the time
// from each enqueue to its handler's start).
func runS9(ctx context.Context, env *benchEnv) error {
	const procs, conc, tasks, dur = 20, 10, 200, 1
	const idle, gap = 5 * time.Second, 10 * time.Millisecond
	r, err := prepareFleet(env, "s9", conc, "", "")
	if err != nil {
		return err
	}
	defer r.stop()
	if err := r.launch(procs); err != nil {
		return err
	}
	// Fully started: every process registered its asynq server, and every
	// one's idle dequeue waits for a push.
	if err := waitServers(ctx, r.mainRDB, r.pids()); err != nil {
		return err
	}
	if err := waitBlocked(ctx, r.mainRDB, procs); err != nil {
		return err
	}
	if err := r.markCommands(ctx); err != nil {
		return err
	}
	window := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(idle):
	}
	cmds, err := r.commandsSinceMark(ctx)
	if err != nil {
		return err
	}
	idleFor := time.Since(window)
	tick := time.NewTicker(gap)
	defer tick.Stop()
	for i := range tasks {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
		b, _ := json.Marshal(probe.Payload{MS: dur, EnqueuedUS: time.Now().UnixMicro()})
		if _, err := r.producer.Enqueue(ctx, probe.Type, b); err != nil {
			return err
		}
	}
	if err := r.wait(ctx, tasks, time.Minute); err != nil {
		return err
	}
	pickups, err := r.counters.Pickups(ctx)
	if err != nil {
		return err
	}
	if len(pickups) != tasks {
		return fmt.Errorf("%d pickup times recorded for %d tasks", len(pickups), tasks)
	}
	slices.Sort(pickups)
	ms := func(d time.Duration) float64 { return round(float64(d.Microseconds())/1000, 2) }
	return env.emit(map[string]any{
		"peer": "fleetcap", "scenario": "S9", "workers": procs, "conc": conc,
		"idle_ms": idleFor.Milliseconds(), "idle_redis_cmds_per_s": int(float64(cmds) / idleFor.Seconds()),
		"tasks": tasks, "gap_ms": gap.Milliseconds(), "dur_ms": dur,
		// The same ranks as the BullMQ anchor: the values at n*0.5 and
		// n*0.99 of the sorted times.
		"pickup_p50_ms": ms(pickups[tasks/2]), "pickup_p99_ms": ms(pickups[tasks*99/100]),
		"pickup_max_ms": ms(pickups[tasks-1]),
	})
}

// waitBlocked waits until at least n clients of the Redis wait at once in
// BLMOVE or BLPOP: the idle dequeues of n worker processes (one queue each;
// one watches the queue, the others its doorbell).
func waitBlocked(ctx context.Context, rdb *redis.Client, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := rdb.ClientList(ctx).Result()
		blocked := 0
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, " flags=b ") && (strings.Contains(line, " cmd=blmove") || strings.Contains(line, " cmd=blpop")) {
				blocked++
			}
		}
		if err == nil && blocked >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d worker processes wait for tasks in BLMOVE after 30s (%v)", blocked, n, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
