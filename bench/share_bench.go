package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/probeworker/probe"
)

// runS10 is a noisy neighbour: a cap of 10 on 3 processes of 10, 10 ms
// tasks. Tenant big enqueues 3,000, then 20 small tenants 30 each; fifo
// has no fair_by, fair has fair_by "{tenant}". weighted: two backlogged
// tenants of weights 3 and 1, 1,500 tasks each.
func runS10(ctx context.Context, env *benchEnv) error {
	var fifoUtil, fifoCmds float64
	variants := []string{"fifo", "fair", "weighted"}
	if v := os.Getenv("BENCH_S10_VARIANT"); v != "" {
		variants = []string{v}
	}
	for _, variant := range variants {
		fields, err := runS10Variant(ctx, env, variant)
		if err != nil {
			return fmt.Errorf("S10 %s: %w", variant, err)
		}
		if variant == "fifo" {
			fifoUtil, fifoCmds = fields["utilization"].(float64), fields["redis_cmds_per_task"].(float64)
		} else if fifoUtil > 0 {
			fields["utilization_vs_fifo"] = round(fields["utilization"].(float64)/fifoUtil, 3)
			fields["redis_cmds_vs_fifo"] = round(fields["redis_cmds_per_task"].(float64)/fifoCmds, 3)
		}
		if err := env.emit(fields); err != nil {
			return err
		}
	}
	return nil
}

func runS10Variant(ctx context.Context, env *benchEnv, variant string) (map[string]any, error) {
	const capacity, procs, conc, dur = 10, 3, 10, 10
	key := fmt.Sprintf("s10-%s-%d", variant, time.Now().UnixNano())
	capYAML := capBlock(key, capacity, "requeue")
	switch variant {
	case "fair":
		capYAML += "      fair_by: \"{tenant}\"\n"
	case "weighted":
		capYAML += "      fair_by: \"{tenant}\"\n      weights: {\"heavy\": 3}\n"
	}
	r, err := prepareFleet(env, "s10-"+variant, conc, capYAML, "")
	if err != nil {
		return nil, err
	}
	defer r.stop()
	if err := r.launch(procs); err != nil {
		return nil, err
	}
	if err := r.markCommands(ctx); err != nil {
		return nil, err
	}
	tenantOf := func(t string) func(int) map[string]any {
		return func(int) map[string]any { return map[string]any{"ms": dur, "tenant": t} }
	}
	var tasks int
	var smallAt time.Time
	if variant == "weighted" {
		tasks = 3000
		err = r.produce(ctx, probe.Type, tasks, func(i int) map[string]any {
			return map[string]any{"ms": dur, "tenant": []string{"heavy", "light"}[i%2]}
		})
	} else {
		tasks = 3000 + 20*30
		err = r.produce(ctx, probe.Type, 3000, tenantOf("big"))
		// The small tenants' 600 tasks go out together, as 20 producers
		// would send them, so that their makespan measures the fleet and
		// not one producer's round trips.
		smallAt = time.Now()
		if err == nil {
			err = r.produce(ctx, probe.Type, 20*30, func(i int) map[string]any {
				return map[string]any{"ms": dur, "tenant": fmt.Sprintf("small-%02d", i%20), "enqueued_us": time.Now().UnixMicro()}
			})
		}
	}
	if err == nil {
		err = r.wait(ctx, tasks, 5*time.Minute)
	}
	var cmds int64
	if err == nil {
		cmds, err = r.commandsSinceMark(ctx)
	}
	if err != nil {
		return nil, err
	}
	makespan, err := r.counters.Makespan(ctx)
	peak, perr := r.counters.MaxInflight(ctx)
	starts, serr := r.counters.TenantStarts(ctx)
	ends, eerr := r.counters.TenantLastEnds(ctx)
	if err := errors.Join(err, perr, serr, eerr); err != nil {
		return nil, err
	}
	ideal := float64(tasks*dur) / capacity
	fields := map[string]any{
		"peer": "fleetcap", "scenario": "S10", "variant": variant, "cap": capacity, "workers": procs, "conc": conc,
		"tasks": tasks, "dur_ms": dur, "makespan_ms": makespan.Milliseconds(), "utilization": round(ideal/float64(makespan.Milliseconds()), 3),
		"max_inflight": peak, "redis_cmds_per_task": round(float64(cmds)/float64(tasks), 2),
	}
	if variant == "weighted" {
		// While both wait: the starts before either tenant's last start,
		// past the first round of seats.
		lastOf := map[string]int{}
		for i, s := range starts {
			lastOf[s.Tenant] = i
		}
		until := min(lastOf["heavy"], lastOf["light"])
		heavy, n := 0, 0
		for _, s := range starts[min(capacity*2, until):until] {
			n++
			if s.Tenant == "heavy" {
				heavy++
			}
		}
		fields["heavy_share"] = round(float64(heavy)/float64(max(n, 1)), 3)
		if os.Getenv("BENCH_S10_TRACE") != "" {
			var b strings.Builder
			for i := 0; i+200 <= len(starts); i += 200 {
				h := 0
				for _, s := range starts[i : i+200] {
					if s.Tenant == "heavy" {
						h++
					}
				}
				fmt.Fprintf(&b, "%d:%.2f ", i, float64(h)/200)
			}
			fmt.Fprintln(os.Stderr, "S10 weighted: heavy share by 200 starts:", b.String(), "until", until)
		}
		return fields, nil
	}
	var lastSmallEnd time.Time
	for tenant, at := range ends {
		if strings.HasPrefix(tenant, "small-") && at.After(lastSmallEnd) {
			lastSmallEnd = at
		}
	}
	// While small tenants wait: from the first small enqueue to the last
	// small start.
	lastSmall := 0
	for i, s := range starts {
		if s.Tenant != "big" {
			lastSmall = i
		}
	}
	if os.Getenv("BENCH_S10_TRACE") != "" {
		var b strings.Builder
		for _, s := range starts[:lastSmall+1] {
			if !s.At.Before(smallAt) {
				fmt.Fprintf(&b, "%s@%d ", strings.TrimPrefix(s.Tenant, "small-"), s.At.Sub(smallAt).Milliseconds())
			}
		}
		fmt.Fprintln(os.Stderr, "S10", variant, "starts after the first small enqueue:", b.String())
		if pickups, err := r.counters.Pickups(ctx); err == nil && len(pickups) > 8 {
			fmt.Fprintln(os.Stderr, "S10", variant, "the last small pickups:", pickups[len(pickups)-8:])
		}
	}
	big, n := 0, 0
	for _, s := range starts[:lastSmall+1] {
		if s.At.Before(smallAt) {
			continue
		}
		n++
		if s.Tenant == "big" {
			big++
		}
	}
	fields["small_makespan_ms"] = lastSmallEnd.Sub(smallAt).Milliseconds()
	fields["small_ideal_ms"] = 600 * dur * 21 / (capacity * 20)
	fields["big_share_while_small_waiting"] = round(float64(big)/float64(max(n, 1)), 3)
	return fields, nil
}
