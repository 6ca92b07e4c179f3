package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/semaphore"
)

// runS3 measures acquire -> hold -> release cycles, uncontended and
// contended.
func runS3(ctx context.Context, env *benchEnv) error {
	if path := os.Getenv("FLEETCAP_CPUPROFILE"); path != "" {
		// A CPU profile of the S3 runs, to look for hot spots.
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	for _, v := range []struct {
		variant string
		limit   int
		hold    time.Duration
	}{
		{"uncontended", 1000, 0},
		{"contended", 5, 5 * time.Millisecond},
	} {
		if err := s3(ctx, env, v.variant, v.limit, 50, v.hold, 5*time.Second); err != nil {
			return err
		}
	}
	return nil
}

func s3(ctx context.Context, env *benchEnv, variant string, limit, callers int, hold, dur time.Duration) error {
	rdb := env.client()
	defer rdb.Close()
	svc, err := semaphore.New(rdb, semaphore.Options{})
	if err != nil {
		return err
	}
	defer svc.Close()
	key := fmt.Sprintf("s3-%d", time.Now().UnixNano())
	var (
		cycles  atomic.Int64
		heldNs  atomic.Int64
		mu      sync.Mutex
		waits   []float64
		firstEr error
	)
	cmdsStart, cpuStart, err := serverUse(ctx, rdb)
	if err != nil {
		return err
	}
	stopAt := time.Now().Add(dur)
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]float64, 0, 1024)
			for time.Now().Before(stopAt) && ctx.Err() == nil {
				w0 := time.Now()
				p, err := svc.Acquire(ctx, key, limit, semaphore.WithTTL(30*time.Second))
				if err != nil {
					mu.Lock()
					firstEr = err
					mu.Unlock()
					return
				}
				w1 := time.Now()
				local = append(local, float64(w1.Sub(w0))/1e6)
				if hold > 0 {
					time.Sleep(hold)
				}
				heldNs.Add(int64(time.Since(w1)))
				if err := p.Release(ctx); err != nil {
					mu.Lock()
					firstEr = err
					mu.Unlock()
					return
				}
				cycles.Add(1)
			}
			mu.Lock()
			waits = append(waits, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstEr != nil {
		return firstEr
	}
	cmdsEnd, cpuEnd, err := serverUse(ctx, rdb)
	if err != nil {
		return err
	}
	// The calls between the two counts that are not the cycles': the
	// first count itself and the first read of the CPU.
	const readsBetween = 2
	slices.Sort(waits)
	pct := func(p float64) float64 {
		if len(waits) == 0 {
			return 0
		}
		return round(waits[int(p*float64(len(waits)-1))], 2)
	}
	var util any
	if hold > 0 {
		util = round(float64(heldNs.Load())/(float64(min(limit, callers))*float64(elapsed)), 3)
	}
	return env.emit(map[string]any{
		"peer": "fleetcap", "scenario": "S3", "variant": variant, "limit": limit, "loops": callers,
		"hold_ms": hold.Milliseconds(), "cycles_per_s": int(float64(cycles.Load()) / elapsed.Seconds()),
		"utilization": util, "wait_p50_ms": pct(0.5), "wait_p99_ms": pct(0.99),
		"redis_cpu_us_per_cycle": round(float64((cpuEnd-cpuStart).Microseconds())/float64(max(cycles.Load(), 1)), 1),
		"redis_cmds_per_cycle":   round(float64(cmdsEnd-cmdsStart-readsBetween)/float64(max(cycles.Load(), 1)), 2),
	})
}

// runS4 measures what 200 waiters on a full semaphore cost Redis.
func runS4(ctx context.Context, env *benchEnv) error {
	const limit, waiters, secs = 5, 200, 5
	rdb := env.client()
	defer rdb.Close()
	svc, err := semaphore.New(rdb, semaphore.Options{})
	if err != nil {
		return err
	}
	defer svc.Close()
	key := fmt.Sprintf("s4-%d", time.Now().UnixNano())
	var held []*semaphore.Permit
	for range limit {
		p, err := svc.Acquire(ctx, key, limit, semaphore.WithTTL(time.Minute))
		if err != nil {
			return err
		}
		held = append(held, p)
	}
	c0, err := commandCount(ctx, rdb)
	if err != nil {
		return err
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := svc.Acquire(ctx, key, limit, semaphore.WithWaitTimeout(secs*time.Second), semaphore.WithTTL(time.Minute))
			if err == nil {
				_ = p.Release(ctx)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	c1, err := commandCount(ctx, rdb)
	if err != nil {
		return err
	}
	for _, p := range held {
		if err := p.Release(ctx); err != nil {
			return err
		}
	}
	return env.emit(map[string]any{
		"peer": "fleetcap", "scenario": "S4", "limit": limit, "waiters": waiters,
		"secs": round(elapsed.Seconds(), 1), "redis_cmds_per_s": int(float64(c1-c0-1) / elapsed.Seconds()),
	})
}

func round(x float64, places int) float64 {
	p := math.Pow(10, float64(places))
	return math.Round(x*p) / p
}

// serverUse is the Redis server's command count (INFO commandstats) and
// CPU time so far, read in that order.
func serverUse(ctx context.Context, rdb *redis.Client) (cmds int64, cpu time.Duration, err error) {
	if cmds, err = commandCount(ctx, rdb); err != nil {
		return 0, 0, err
	}
	cpu, err = serverCPU(ctx, rdb)
	return cmds, cpu, err
}
