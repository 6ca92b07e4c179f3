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
	"github.com/fleetcap/fleetcap/semaphore"
	"github.com/fleetcap/fleetcap/worker"
)

// slotCounter counts, across every worker of a fleet, the slots that hold a
// capped task which is not running, as the workers report them to their
// Observer (Waiting: from when a task asks for its seat until it runs or
// goes back; a task that runs is counted out before its standby place goes
// to the next). It keeps the most it ever saw (every change is counted,
// none sampled away). Counted at the handler's start instead, a task given
// its seat whose handler had not started yet could be counted beside the
// next task its place brought in.
type slotCounter struct {
	waiting, most atomic.Int64
}

func (c *slotCounter) Waiting(_ string, delta int) {
	n := c.waiting.Add(int64(delta))
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
}

func (c *slotCounter) Acquire(semaphore.AcquireEvent)  {}
func (c *slotCounter) Release(semaphore.ReleaseEvent)  {}
func (c *slotCounter) Lost(string)                     {}
func (c *slotCounter) ActiveChanged(string, int)       {}
func (c *slotCounter) Requeued(string, string, string) {}
func (c *slotCounter) LeaseLost(string, string)        {}

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
	startWorkersWith(t, workers, yaml, map[string]asynq.HandlerFunc{
		"capped": func(ctx context.Context, task *asynq.Task) error {
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
	}, []worker.Option{worker.WithObserver(&counter)})
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
