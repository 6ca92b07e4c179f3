package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/probeworker/probe"
)

// runS5 is fleet growth: one capped task type in requeue mode, served by 1,
// 5 and 20 processes of 10, its tasks enqueued through the producer while
// the fleet runs. The cap must stay busy (utilization), the Redis commands
// a task costs must not grow with the fleet, and the slots that hold a
// capped task which is not running (fleet-wide) must stay within the cap's
// standby budget.
func runS5(ctx context.Context, env *benchEnv) error {
	const capacity, conc, tasks, dur = 5, 10, 2000, 10
	variants := []int{1, 5, 20}
	if os.Getenv("BENCH_S5_PROCS") != "" { // e.g. "20": one variant, for a closer look
		n, err := envCount("BENCH_S5_PROCS", 0)
		if err != nil {
			return err
		}
		variants = []int{n}
	}
	// The cap's standby budget (tasks that wait in a worker slot for the
	// next seat, fleet-wide): the config's default, the capacity, unless
	// BENCH_S5_STANDBY sets it (0 turns standby off).
	standby, err := envInt("BENCH_S5_STANDBY", capacity, 0)
	if err != nil {
		return err
	}
	for _, procs := range variants {
		key := fmt.Sprintf("s5-%d-%d", procs, time.Now().UnixNano())
		capYAML := capBlock(key, capacity, "requeue")
		if os.Getenv("BENCH_S5_STANDBY") != "" {
			capYAML += fmt.Sprintf("      standby: %d\n", standby)
		}
		r, err := prepareFleet(env, fmt.Sprintf("s5-%d", procs), conc, capYAML, "")
		if err != nil {
			return err
		}
		err = r.launch(procs, "--slots-waiting")
		if err == nil {
			err = r.markCommands(ctx)
		}
		if err == nil {
			err = r.produce(ctx, probe.Type, tasks, func(int) map[string]any { return map[string]any{"ms": dur} })
		}
		if err == nil {
			err = r.wait(ctx, tasks, 5*time.Minute)
		}
		var cmds int64
		var cpu float64
		if err == nil {
			cmds, err = r.commandsSinceMark(ctx)
		}
		if err == nil {
			cpu, err = r.cpuPerTask(ctx, tasks)
		}
		if err != nil {
			r.stop()
			return err
		}
		makespan, err := r.counters.Makespan(ctx)
		peak, perr := r.counters.MaxInflight(ctx)
		runs, rerr := r.counters.Runs(ctx)
		waiting, werr := r.counters.MaxSlotsWaiting(ctx)
		err = errors.Join(err, perr, rerr, werr)
		var seatFields map[string]any
		if err == nil {
			seatFields, err = probeFields(ctx, r, dur)
		}
		r.stop()
		if err != nil {
			return err
		}
		ideal := float64(tasks*dur) / float64(capacity)
		ms := float64(makespan.Milliseconds())
		if err := env.emit(merge(map[string]any{
			"peer": "fleetcap", "scenario": "S5", "variant": procs, "cap": capacity, "workers": procs, "conc": conc,
			"standby": standby, "tasks": tasks, "dur_ms": dur, "makespan_ms": int(ms), "utilization": round(ideal/ms, 3),
			"redis_cmds_per_task": round(float64(cmds)/tasks, 2), "redis_cpu_us_per_task": cpu,
			"max_inflight": peak, "runs": runs, "max_slots_waiting": waiting,
		}, seatFields)); err != nil {
			return err
		}
	}
	return nil
}

// runS6 is many tenants: a per-tenant cap of 2 over 10,000 tenants, 20,000
// tasks of 1 ms on 3 processes. No tenant may run more than 2 at once, a
// task's Redis commands must not grow with the tenants, and every key the
// run wrote per tenant must expire within the lease TTL after it.
func runS6(ctx context.Context, env *benchEnv) error {
	const capacity, procs, conc, tenants, tasks, dur = 2, 3, 10, 10000, 20000, 1
	const ttl = 30 * time.Second
	prefix := fmt.Sprintf("s6-%d:", time.Now().UnixNano())
	capYAML := fmt.Sprintf("    semaphores:\n      - key: \"tenant:{tenant_id}\"\n        capacity: %d\n        mode: requeue\n        ttl: %s\n", capacity, ttl)
	r, err := startFleetWith(env, "s6", procs, conc, capYAML, "semaphore:\n  prefix: \""+prefix+"\"\n")
	if err != nil {
		return err
	}
	defer r.stop()
	// The baseline: the fleet's own keys (asynq's server and worker
	// records) once every process has registered.
	if err := waitServers(ctx, r.mainRDB, r.pids()); err != nil {
		return err
	}
	baseline, err := keySet(ctx, r.mainRDB)
	if err != nil {
		return err
	}
	if err := r.markCommands(ctx); err != nil {
		return err
	}
	err = r.enqueue(ctx, tasks, func(i int) map[string]any {
		// Each tenant's two tasks are neighbours in the queue, so they
		// meet: the peak per tenant reaches the cap.
		t := fmt.Sprintf("t%05d", (i/2)%tenants)
		return map[string]any{"ms": dur, "tenant": t, "tenant_id": t}
	})
	if err == nil {
		err = r.wait(ctx, tasks, 5*time.Minute)
	}
	if err != nil {
		return err
	}
	ended := time.Now()
	cmds, err := r.commandsSinceMark(ctx)
	if err != nil {
		return err
	}
	makespan, err := r.counters.Makespan(ctx)
	if err != nil {
		return err
	}
	tmax, err := r.counters.MaxInflightPerTenant(ctx)
	if err != nil {
		return err
	}
	peak := 0
	for _, n := range tmax {
		peak = max(peak, n)
	}
	runs, err := r.counters.Runs(ctx)
	if err != nil {
		return err
	}
	// Keys the run left: every semaphore key (its prefix, then its hash
	// tag; the fleet's idle watches share the prefix) must expire;
	// asynq's per-queue counters stay (one queue, not one per tenant) and
	// are reported apart.
	semAtEnd, err := countKeys(ctx, r.mainRDB, prefix+"{*")
	if err != nil {
		return err
	}
	var semLeft, after int64
	var kept, other []string
	deadline := ended.Add(ttl + 10*time.Second)
	for {
		if semLeft, err = countKeys(ctx, r.mainRDB, prefix+"{*"); err != nil {
			return err
		}
		now, err := keySet(ctx, r.mainRDB)
		if err != nil {
			return err
		}
		after = int64(len(now))
		kept, other = newKeys(baseline, now, r.queue)
		if semLeft == 0 && len(other) == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	if len(other) > 20 {
		other = append(other[:20], fmt.Sprintf("... %d more", len(other)-20))
	}
	return env.emit(map[string]any{
		"peer": "fleetcap", "scenario": "S6", "cap": capacity, "tenants": tenants, "workers": procs, "conc": conc,
		"tasks": tasks, "dur_ms": dur, "ms": makespan.Milliseconds(),
		"tasks_per_s":             int(float64(tasks) / makespan.Seconds()),
		"redis_cmds_per_task":     round(float64(cmds)/tasks, 2),
		"max_inflight_per_tenant": peak, "runs": runs,
		"redis_keys_before": len(baseline), "redis_keys_after": after,
		"semaphore_keys_at_end": semAtEnd, "semaphore_keys_after": semLeft,
		"keys_settled_after_ms": time.Since(ended).Milliseconds(), "lease_ttl_ms": ttl.Milliseconds(),
		"queue_keys_kept": kept, "other_keys_left": other,
	})
}

// waitServers waits until the asynq server of each of pids has registered.
// Counting them would not do: a fleet that has just stopped leaves its
// servers in the set until their records expire.
func waitServers(ctx context.Context, rdb *redis.Client, pids []int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing, err := unregistered(ctx, rdb, pids)
		if err == nil && len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the asynq servers of processes %v not registered after 30s (%v)", missing, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// unregistered is the pids that have no asynq server record yet (records
// are keys named "asynq:servers:{host:pid:id}"). It reads the keys, not the
// set asynq:servers: a server is added to the set before its record and
// worker keys are written, so the set alone would let a baseline miss them.
func unregistered(ctx context.Context, rdb *redis.Client, pids []int) ([]int, error) {
	names, err := rdb.Keys(ctx, "asynq:servers:*").Result()
	if err != nil {
		return pids, err
	}
	registered := map[string]bool{}
	for _, name := range names {
		if parts := strings.Split(strings.Trim(strings.TrimPrefix(name, "asynq:servers:"), "{}"), ":"); len(parts) >= 3 {
			registered[parts[len(parts)-2]] = true
		}
	}
	var missing []int
	for _, pid := range pids {
		if !registered[strconv.Itoa(pid)] {
			missing = append(missing, pid)
		}
	}
	return missing, nil
}

// keySet is every key of the Redis (the bench's Redis is small).
func keySet(ctx context.Context, rdb *redis.Client) (map[string]bool, error) {
	out := map[string]bool{}
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		out[iter.Val()] = true
	}
	return out, iter.Err()
}

// newKeys splits the keys of now that are not in base into asynq's
// per-queue records of queue that outlive its tasks (the queue set, the
// processed and failed counters) and all others.
func newKeys(base, now map[string]bool, queue string) (kept, other []string) {
	qp := "asynq:{" + queue + "}:"
	for k := range now {
		if base[k] {
			continue
		}
		rest, ok := strings.CutPrefix(k, qp)
		switch {
		case k == "asynq:queues":
			kept = append(kept, k)
		case ok && (strings.HasPrefix(rest, "processed") || strings.HasPrefix(rest, "failed")):
			kept = append(kept, "asynq:{Q}:"+rest)
		default:
			other = append(other, k)
		}
	}
	slices.Sort(kept)
	slices.Sort(other)
	return kept, other
}

// countKeys counts the keys matching pattern.
func countKeys(ctx context.Context, rdb *redis.Client, pattern string) (int64, error) {
	var n int64
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	return n, iter.Err()
}
