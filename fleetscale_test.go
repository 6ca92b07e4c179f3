package fleetcap_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
)

// slotCounter counts, across every worker of a fleet, the slots that hold a
// capped task which is not running: from the moment asynq hands the task
// to a worker until its handler starts, or until it goes back. It keeps
// the most it ever saw (every change is counted, none sampled away).
type slotCounter struct {
	waiting, most atomic.Int64
}

type startedKey struct{}

// middleware counts the capped task types' tasks in.
func (c *slotCounter) middleware(capped string) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			if t.Type() != capped {
				return next.ProcessTask(ctx, t)
			}
			started := &atomic.Bool{}
			n := c.waiting.Add(1)
			for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
			}
			err := next.ProcessTask(context.WithValue(ctx, startedKey{}, started), t)
			if !started.Load() {
				c.waiting.Add(-1)
			}
			return err
		})
	}
}

// start is called by a capped handler as it starts.
func (c *slotCounter) start(ctx context.Context) {
	if started, ok := ctx.Value(startedKey{}).(*atomic.Bool); ok && started.CompareAndSwap(false, true) {
		c.waiting.Add(-1)
	}
}

// TestStandbyBudgetIsFleetWide: 8 workers of 4 slots on one Redis, a cap of
// 2 seats (its standby budget is its capacity, 2, for the whole fleet), a
// backlog of 80 capped tasks enqueued through the producer beside 400
// uncapped ones in the same queue. However many slots the fleet has, at
// most 2 hold a capped task that is not running, at every moment; the
// cap is never exceeded; the uncapped tasks finish while the capped backlog
// still waits (in Redis, not in slots); and every task runs once.
func TestStandbyBudgetIsFleetWide(t *testing.T) {
	const workers, slots, capacity, capped, uncapped = 8, 4, 2, 80, 400
	srv := redistest.Start(t)
	yaml := fmt.Sprintf(`redis: {url: %q}
worker: {concurrency: %d, shutdown_timeout: 3s}
monitoring: {addr: "127.0.0.1:0"}
tasks:
  capped:
    max_retry: 3
    semaphore: {key: scarce, capacity: %d, ttl: 10s, wait_timeout: 2s}
  free:
    max_retry: 3
`, srv.URL(), slots, capacity)
	var counter slotCounter
	var running, mostRunning, cappedDone, uncappedDone atomic.Int64
	var runs sync.Map
	startWorkers(t, workers, yaml, map[string]asynq.HandlerFunc{
		"capped": func(ctx context.Context, task *asynq.Task) error {
			counter.start(ctx)
			n := running.Add(1)
			for m := mostRunning.Load(); n > m && !mostRunning.CompareAndSwap(m, n); m = mostRunning.Load() {
			}
			// 100 ms a task: the backlog takes 4 s at 2 seats, so that the
			// uncapped tasks finish well within its first half even on a
			// loaded machine (they took 1.6 s in a run beside a build).
			time.Sleep(100 * time.Millisecond)
			running.Add(-1)
			id, _ := asynq.GetTaskID(ctx)
			if _, again := runs.LoadOrStore(id, true); again {
				t.Errorf("task %s ran twice", id)
			}
			cappedDone.Add(1)
			return nil
		},
		"free": func(context.Context, *asynq.Task) error {
			uncappedDone.Add(1)
			return nil
		},
	}, counter.middleware("capped"))
	p := newProducer(t, yaml, "capped", "free")
	ctx := context.Background()
	for i := range capped {
		if _, err := p.Enqueue(ctx, "capped", []byte(fmt.Sprintf(`{"n":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	for range uncapped {
		if _, err := p.Enqueue(ctx, "free", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Condition(t, 60*time.Second, "the uncapped tasks finish", func() bool { return uncappedDone.Load() == uncapped })
	left := capped - cappedDone.Load()
	t.Logf("uncapped tasks done with %d capped tasks still waiting", left)
	if left < capped/2 {
		t.Errorf("only %d capped tasks were still waiting when the uncapped ones were done: uncapped tasks did not flow beside the backlog", left)
	}
	waitfor.Condition(t, 120*time.Second, "the capped backlog finishes", func() bool { return cappedDone.Load() == capped })
	t.Logf("at most %d slots of %d held a capped task that was not running; at most %d ran at once", counter.most.Load(), workers*slots, mostRunning.Load())
	if m := counter.most.Load(); m > capacity {
		t.Errorf("%d slots held a capped task that was not running at once; the fleet-wide standby budget is %d", m, capacity)
	}
	if m := mostRunning.Load(); m > capacity {
		t.Errorf("cap exceeded: %d ran at once, capacity %d", m, capacity)
	}
}
