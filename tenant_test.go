// End-to-end tests of per-tenant and stacked caps: probe worker processes
// on one real Redis, probes carrying a tenant, an independent counter of how
// many run at once overall and per tenant.
package fleetcap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/fleettest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
)

// startFleetTypes is startFleet with several probe task types, each with
// the caps in its entry of caps (indented for tasks.<type>).
func startFleetTypes(t *testing.T, n, concurrency int, caps map[string]string) *fleet {
	t.Helper()
	return startFleetConfig(t, n, func(redisURL string) string {
		return fleettest.ConfigTypes(redisURL, "default", concurrency, caps)
	})
}

// enqueueTenant adds one probe of taskType with this payload and returns its
// ID; every third has max_retry 0, so that a full semaphore must not
// archive it either.
func (f *fleet) enqueueRaw(taskType, payload string, i int) string {
	f.t.Helper()
	opts := []asynq.Option{asynq.MaxRetry(3)}
	if i%3 == 0 {
		opts = []asynq.Option{asynq.MaxRetry(0)}
	}
	info, err := f.client.Enqueue(asynq.NewTask(taskType, []byte(payload)), opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	return info.ID
}

func probePayload(ms int, tenant string) string {
	b, _ := json.Marshal(map[string]any{"ms": ms, "tenant": tenant})
	return string(b)
}

// tenantCaps is the stack of SPEC §2.4: a global cap and a per-tenant cap.
func tenantCaps(mode string, global, perTenant int, extra string) string {
	return fmt.Sprintf(`    semaphores:
      - {key: global, capacity: %d, mode: %s, ttl: 10s, wait_timeout: 2s}
      - key: "tenant:{tenant}"
        capacity: %d
        mode: %s
        ttl: 10s
        wait_timeout: 2s
%s`, global, mode, perTenant, mode, extra)
}

// checkPeaks asserts the overall peak is exactly global (held and reached)
// and each tenant's peak is exactly its own capacity.
func (f *fleet) checkPeaks(ctx context.Context, global int, perTenant map[string]int) {
	f.t.Helper()
	peak, err := f.counters.MaxInflight(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	if peak != global {
		f.t.Errorf("overall: at most %d probes ran at once, want exactly the global cap %d", peak, global)
	}
	tmax, err := f.counters.MaxInflightPerTenant(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	for tenant, want := range perTenant {
		if tmax[tenant] != want {
			f.t.Errorf("tenant %s: at most %d of its probes ran at once, want exactly its cap %d (all: %v)", tenant, tmax[tenant], want, tmax)
		}
	}
}

func (f *fleet) noneArchived() {
	f.t.Helper()
	info, err := f.insp.GetQueueInfo("default")
	if err != nil {
		f.t.Fatal(err)
	}
	if info.Archived != 0 {
		archived, _ := f.insp.ListArchivedTasks("default")
		for _, a := range archived {
			f.t.Logf("archived %s: %s", a.ID, a.LastErr)
		}
		f.t.Fatalf("%d tasks archived", info.Archived)
	}
}

// TestTenantAndGlobalCapsHold: a global cap of 5 and a per-tenant cap of 2
// hold together across 3 processes, in both modes: no tenant ever runs more
// than 2 at once, the fleet never more than 5, and both are reached.
func TestTenantAndGlobalCapsHold(t *testing.T) {
	for _, mode := range []string{"requeue", "wait"} {
		t.Run(mode, func(t *testing.T) {
			const perTenantTasks = 16
			tenants := []string{"t1", "t2", "t3", "t4"}
			f := startFleetTypes(t, 3, 6, map[string]string{"probe": tenantCaps(mode, 5, 2, "")})
			ctx := context.Background()
			for i := range perTenantTasks {
				for _, tenant := range tenants {
					f.enqueueRaw("probe", probePayload(30, tenant), i)
				}
			}
			n := perTenantTasks * len(tenants)
			if err := f.counters.WaitDone(ctx, n, 90*time.Second, f.procsAlive()); err != nil {
				t.Fatal(err)
			}
			f.checkPeaks(ctx, 5, map[string]int{"t1": 2, "t2": 2, "t3": 2, "t4": 2})
			f.noneArchived()
		})
	}
}

// TestCapacityOverride: a tenant with capacity_overrides 4 runs 4 at once,
// the others stay at 2. The tasks run 150 ms, so that on a loaded machine
// the seats a task frees are taken up while the others still run.
func TestCapacityOverride(t *testing.T) {
	f := startFleetTypes(t, 3, 6, map[string]string{"probe": tenantCaps("requeue", 12, 2,
		"        capacity_overrides: {\"tenant:big\": 4}\n")})
	ctx := context.Background()
	tenants := []string{"big", "s1", "s2"}
	for i := range 16 {
		for _, tenant := range tenants {
			f.enqueueRaw("probe", probePayload(150, tenant), i)
		}
	}
	if err := f.counters.WaitDone(ctx, 16*len(tenants), 90*time.Second, f.procsAlive()); err != nil {
		t.Fatal(err)
	}
	f.checkPeaks(ctx, 8, map[string]int{"big": 4, "s1": 2, "s2": 2})
	f.noneArchived()
}

// TestNoisyTenant: 500 tasks of one tenant, queued first, do not hold up a
// quiet tenant's single task by more than a few task-lengths: the noisy
// tenant's excess goes back to the queue (parked) instead of filling the
// worker slots.
func TestNoisyTenant(t *testing.T) {
	const ms = 300
	f := startFleetTypes(t, 3, 10, map[string]string{"probe": tenantCaps("requeue", 5, 2, "")})
	ctx := context.Background()
	// The backlog is all in the queue, ahead of the quiet task, when the
	// fleet starts on it.
	f.enqueueRaw("probe", probePayload(ms, "noisy"), 1)
	if err := f.insp.PauseQueue("default"); err != nil {
		t.Fatal(err)
	}
	for i := range 499 {
		f.enqueueRaw("probe", probePayload(ms, "noisy"), i+2)
	}
	quiet := f.enqueueRaw("probe", probePayload(ms, "quiet"), 1)
	if err := f.insp.UnpauseQueue("default"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	for {
		done, err := f.counters.IsDone(ctx, quiet)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if err := f.procsAlive()(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the quiet tenant's task not done %s after it was enqueued behind 500 noisy ones", time.Since(start))
		}
		time.Sleep(2 * time.Millisecond)
	}
	took := time.Since(start)
	done, err := f.counters.Done(ctx)
	if err != nil {
		t.Fatal(err)
	}
	noisyDone := done - 1
	t.Logf("the quiet tenant's task (%d ms) finished %s after the fleet started on the queue, with %d of the 500 noisy tasks done", ms, took.Round(time.Millisecond), noisyDone)
	// It runs once a worker slot reaches it, while the noisy excess drains
	// from the queue: counted in noisy tasks done rather than in time, so
	// that a loaded machine does not fail it. Behind the whole backlog it
	// would see 500 done; 50 is 25 rounds of the noisy tenant's 2 seats.
	if noisyDone > 50 {
		t.Errorf("the quiet tenant's task finished after %d noisy tasks, want at most 50: it waited behind the noisy backlog", noisyDone)
	}
	tmax, err := f.counters.MaxInflightPerTenant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tmax["noisy"] > 2 || tmax["quiet"] != 1 {
		t.Errorf("per-tenant peaks %v: want noisy <= 2, quiet 1", tmax)
	}
}

// TestBadPayloadArchived: a probe whose payload cannot render its key
// (missing field, object field) is archived at once with a message naming
// the field, and never runs; good tasks around it run.
func TestBadPayloadArchived(t *testing.T) {
	for _, mode := range []string{"requeue", "wait"} {
		t.Run(mode, func(t *testing.T) {
			f := startFleetTypes(t, 2, 4, map[string]string{"probe": tenantCaps(mode, 5, 2, "")})
			ctx := context.Background()
			bad := map[string]string{ // payload -> what the error must say
				`{"ms":1}`:                     `payload field "tenant" is missing`,
				`{"ms":1,"tenant":{"id":"x"}}`: `payload field "tenant" is an object, want a string, number or boolean`,
				`{"ms":1,"tenant":""}`:         `payload field "tenant" is an empty string`,
			}
			ids := map[string]string{}
			for payload, want := range bad {
				ids[f.enqueueRaw("probe", payload, 1)] = want // max_retry 3: archived without retries
			}
			for i := range 6 {
				f.enqueueRaw("probe", probePayload(5, "good"), i)
			}
			if err := f.counters.WaitDone(ctx, 6, 30*time.Second, f.procsAlive()); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				info, err := f.insp.GetQueueInfo("default")
				if err != nil {
					t.Fatal(err)
				}
				if info.Archived == len(bad) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d bad tasks archived (queue %+v)", info.Archived, len(bad), info)
				}
				time.Sleep(10 * time.Millisecond)
			}
			archived, err := f.insp.ListArchivedTasks("default")
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range archived {
				want, ok := ids[a.ID]
				if !ok {
					t.Errorf("archived a good task %s: %s", a.ID, a.LastErr)
					continue
				}
				if !strings.Contains(a.LastErr, want) || !strings.Contains(a.LastErr, `not run: its payload cannot render its semaphore key: key template "tenant:{tenant}"`) {
					t.Errorf("task %s archived with %q, want it to name the template and say %q", a.ID, a.LastErr, want)
				}
				if a.Retried != 0 {
					t.Errorf("task %s retried %d times before it was archived, want 0", a.ID, a.Retried)
				}
				t.Logf("archived: %s", a.LastErr)
			}
			runs, err := f.counters.Runs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if runs != 6 {
				t.Errorf("%d probe runs, want the 6 good ones only", runs)
			}
			// Every seat comes back; a worker's idle spare seats within
			// a moment (semaphore.Options.SpareSeats).
			holders := f.semHolders(t, "global")
			if !waitfor.Eventually(5*time.Second, func() bool { return len(holders()) == 0 }) {
				t.Errorf("seats of global still held after the run: %v", holders())
			}
		})
	}
}

// TestStackedCapsNoDeadlock: two task types take the same two keys, declared
// in opposite order; a task must hold both to run. Seats are taken in key
// order and never held while waiting, so the fleet neither deadlocks nor
// leaves a seat idle; in wait mode a waiter that held a seat would block the
// other type for good.
func TestStackedCapsNoDeadlock(t *testing.T) {
	for _, mode := range []string{"requeue", "wait"} {
		t.Run(mode, func(t *testing.T) {
			capLine := func(key string) string {
				return fmt.Sprintf("      - {key: %q, capacity: 2, mode: %s, ttl: 10s, wait_timeout: 3s}\n", key, mode)
			}
			f := startFleetTypes(t, 3, 6, map[string]string{
				"probe":  "    semaphores:\n" + capLine("res-a") + capLine("res-b"),
				"probe2": "    semaphores:\n" + capLine("res-b") + capLine("res-a"),
			})
			ctx := context.Background()
			const each = 40
			for i := range each {
				f.enqueueRaw("probe", probePayload(20, "p1"), i)
				f.enqueueRaw("probe2", probePayload(20, "p2"), i)
			}
			if err := f.counters.WaitDone(ctx, 2*each, 60*time.Second, f.procsAlive()); err != nil {
				t.Fatal(err)
			}
			peak, err := f.counters.MaxInflight(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if peak != 2 {
				t.Errorf("at most %d probes ran at once, want exactly 2 (both keys have 2 seats)", peak)
			}
			f.noneArchived()
		})
	}
}

// TestStackedWakeEveryKey: with no standby, every task that finds a cap full
// is parked on that cap's key and must be woken by a release of that key,
// whichever of the two it is; a lost wake-up would leave it to the 10 s
// safety-net delay. 30 tasks of 50 ms on 2 global seats take 0.75 s ideally.
func TestStackedWakeEveryKey(t *testing.T) {
	caps := `    semaphores:
      - {key: global, capacity: 2, standby: 0, ttl: 10s}
      - {key: "tenant:{tenant}", capacity: 1, standby: 0, ttl: 10s}
`
	f := startFleetTypes(t, 3, 4, map[string]string{"probe": caps})
	ctx := context.Background()
	start := time.Now()
	for i := range 10 {
		for _, tenant := range []string{"a", "b", "c"} {
			f.enqueueRaw("probe", probePayload(50, tenant), i)
		}
	}
	if err := f.counters.WaitDone(ctx, 30, 60*time.Second, f.procsAlive()); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("30 tasks done in %s (ideal 0.75 s)", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("30 tasks took %s: parked tasks were left to their 10 s delay instead of being woken", took)
	}
	f.checkPeaks(ctx, 2, map[string]int{"a": 1, "b": 1, "c": 1})
	f.noneArchived()
}

// TestIdleKeysExpire: every key the fleet writes per semaphore key (seats,
// waiting lines, parked lines) carries a TTL while the run goes on, and none
// is left soon after it.
func TestIdleKeysExpire(t *testing.T) {
	caps := `    semaphores:
      - {key: global, capacity: 3, standby: 0, ttl: 2s}
      - {key: "tenant:{tenant}", capacity: 1, mode: wait, wait_timeout: 1s, ttl: 2s}
`
	f := startFleetTypes(t, 3, 4, map[string]string{"probe": caps})
	ctx := context.Background()
	rdb := f.srv.Client()
	semKeys := func() []string {
		// The semaphores' keys: the prefix then the hash tag (the fleet's
		// other keys, such as the watches of its idle queues, do not lapse
		// while it idles).
		keys, err := rdb.Keys(ctx, "fleetcap:sem:{*").Result()
		if err != nil {
			t.Error(err)
		}
		return keys
	}
	// Sample the keys and their TTLs while the run goes on.
	seen := map[string]bool{}
	var noTTL []string
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			for _, k := range semKeys() {
				if !seen[k] {
					seen[k] = true
					// -2: gone meanwhile; -1: no TTL.
					if ttl, err := rdb.PTTL(ctx, k).Result(); err == nil && ttl == -1 {
						noTTL = append(noTTL, k)
					}
				}
			}
		}
	}()
	const tenants, each = 20, 3
	for tn := range tenants { // a tenant's tasks side by side: they meet its cap
		for i := range each {
			f.enqueueRaw("probe", probePayload(40, fmt.Sprintf("t%02d", tn)), i)
		}
	}
	err := f.counters.WaitDone(ctx, tenants*each, 60*time.Second, f.procsAlive())
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	done := time.Now()
	kinds := map[string]int{}
	for k := range seen {
		kinds[k[strings.LastIndexByte(k, ':')+1:]]++
	}
	t.Logf("semaphore keys seen during the run, by kind: %v", kinds) // holders, waiting, slots, parked, places, ...
	if kinds["parked"] == 0 || kinds["holders"] == 0 || kinds["waiting"] == 0 {
		t.Errorf("the run did not park tasks or hold seats (keys seen %v): the test misses its point", kinds)
	}
	if len(noTTL) > 0 {
		t.Errorf("keys without a TTL: %q", noTTL)
	}
	deadline := done.Add(20 * time.Second)
	for {
		left := semKeys()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys left %s after the run: %q", time.Since(done).Round(time.Second), left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("no semaphore key left %s after the run", time.Since(done).Round(100*time.Millisecond))
	f.checkPeaks(ctx, 3, map[string]int{"t00": 1, "t19": 1})
	f.noneArchived()
}
