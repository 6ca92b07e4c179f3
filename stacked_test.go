package fleetcap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// TestStackedCapsKeepTheirPlace: a task with a shared cap and a tenant cap
// waits for the shared one, is let out, finds its tenant's cap full and
// waits for that instead; when its tenant's seat frees it comes back to
// the shared cap with the place it first took there, ahead of the tasks
// that came after it. (Issue 19, defect 9: it came back as a newcomer and
// ran after every task that had arrived meanwhile.)
//
// The timeline (job tasks hold both caps for 400 ms): a task of tenant h
// holds the shared seat; a hog of tenant x (which takes only the tenant
// cap) holds x's seat for a second; x's job waits for the shared seat,
// then the five jobs of y1..y5 behind it. At 0.4 s x's job is let out,
// finds x's seat taken and waits for it; y1 and y2 run; at 1 s x's seat
// frees and x's job comes back to the shared cap, first in line: it runs
// next, at 1.2 s, not after y5.
func TestStackedCapsKeepTheirPlace(t *testing.T) {
	srv := redistest.Start(t)
	yaml := fmt.Sprintf(`redis: {url: %q}
worker: {concurrency: 20, shutdown_timeout: 3s}
monitoring: {addr: "127.0.0.1:0"}
tasks:
  job:
    max_retry: 3
    semaphores:
      - {key: shared, capacity: 1, standby: 0, ttl: 10s, wait_timeout: 5s}
      - {key: "tenant:{tenant}", capacity: 1, standby: 0, ttl: 10s, wait_timeout: 5s}
  hog:
    max_retry: 3
    semaphore: {key: "tenant:{tenant}", capacity: 1, standby: 0, ttl: 10s}
`, srv.URL())
	var mu sync.Mutex
	var order []string // tenants of the jobs, in the order they started
	running := map[string]bool{}
	tenantOf := func(task *asynq.Task) string {
		var p struct{ Tenant string }
		_ = json.Unmarshal(task.Payload(), &p)
		return p.Tenant
	}
	hold := func(d time.Duration, log bool) asynq.HandlerFunc {
		return func(ctx context.Context, task *asynq.Task) error {
			tenant := tenantOf(task)
			mu.Lock()
			if log {
				order = append(order, tenant)
			}
			running[task.Type()+":"+tenant] = true
			mu.Unlock()
			time.Sleep(d)
			return nil
		}
	}
	startWorkers(t, 1, yaml, map[string]asynq.HandlerFunc{"job": hold(400*time.Millisecond, true), "hog": hold(time.Second, false)})
	p := newProducer(t, yaml, "job", "hog")
	ctx := context.Background()
	enqueue := func(typ, tenant string) {
		t.Helper()
		if _, err := p.Enqueue(ctx, typ, []byte(fmt.Sprintf(`{"tenant":%q}`, tenant))); err != nil {
			t.Fatal(err)
		}
	}
	started := func(what string) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return running[what] }
	}
	enqueue("hog", "x")
	enqueue("job", "h")
	waitfor.Condition(t, 5*time.Second, "the hog and h's job run", func() bool { return started("hog:x")() && started("job:h")() })
	enqueue("job", "x")
	ys := []string{"y1", "y2", "y3", "y4", "y5"}
	for _, y := range ys {
		enqueue("job", y)
	}
	waitfor.Condition(t, 20*time.Second, "every job runs", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 2+len(ys)
	})
	mu.Lock()
	defer mu.Unlock()
	t.Logf("jobs started in this order: %v", order)
	if at := slices.Index(order, "x"); at > 3 {
		t.Errorf("x's job, first to wait for the shared seat, started after %d jobs that came after it (%v); it should come back to its place, after y1 and y2 at most", at-1, order)
	}
}

// TestStandingByForOneCapHoldsNoPlaceOnAnother: a producer keeps a place on
// each cap of a new task that has one; a task given a standby place on its
// first cap (the seat is taken) and a place on its second stands by in a
// worker slot for the first. While it does, its place on the second goes
// to others: the second cap's room shows nobody waiting and its standby
// place is free. (CI, TestWorkerMetrics: the place stayed, lapsed, and the
// room counted the task as waiting for a cap with free seats.)
func TestStandingByForOneCapHoldsNoPlaceOnAnother(t *testing.T) {
	srv := redistest.Start(t)
	yaml := fmt.Sprintf(`redis: {url: %q}
worker: {concurrency: 4, shutdown_timeout: 3s}
monitoring: {addr: "127.0.0.1:0"}
tasks:
  job:
    semaphores:
      - {key: first, capacity: 1, standby: 1, ttl: 10s, wait_timeout: 20s}
      - {key: second, capacity: 3, standby: 1, ttl: 10s}
`, srv.URL())
	release := make(chan struct{})
	var runs atomic.Int32
	startWorkers(t, 1, yaml, map[string]asynq.HandlerFunc{"job": func(ctx context.Context, _ *asynq.Task) error {
		runs.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}})
	p := newProducer(t, yaml, "job")
	sem, err := semaphore.New(srv.Client(), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	ctx := context.Background()
	stats := func(key string) semaphore.RoomStats {
		st, err := sem.RoomStats(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if _, err := p.Enqueue(ctx, "job", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 10*time.Second, "the first job holds the first cap", func() bool {
		n, err := sem.UsedPermits(ctx, "first")
		return err == nil && n == 1
	})
	// The second job gets the first cap's standby place and a place on the
	// second; in the worker it stands by for the first cap.
	if _, err := p.Enqueue(ctx, "job", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 10*time.Second, "the second job stands by for the first cap", func() bool {
		st := stats("first")
		return st.Waiting == 1 && st.Standby == 1 && st.Parked == 0
	})
	waitfor.Condition(t, 5*time.Second, "the second cap's room empty while the job stands by for the first", func() bool {
		st := stats("second")
		return st.Waiting == 0 && st.Standby == 0
	})
	close(release)
	waitfor.Condition(t, 15*time.Second, "the second job runs after the first", func() bool { return runs.Load() == 2 })
}
