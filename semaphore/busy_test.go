package semaphore_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// keepCoresBusy runs a spinning goroutine per core, and two more, until the
// test ends: a machine busy building, as the issue saw it.
func keepCoresBusy(t *testing.T) {
	stop := make(chan struct{})
	var spinning sync.WaitGroup
	for range runtime.NumCPU() + 2 {
		spinning.Add(1)
		go func() {
			defer spinning.Done()
			for n := 0; ; n++ {
				if n%1024 == 0 {
					select {
					case <-stop:
						return
					default:
					}
				}
			}
		}()
	}
	t.Cleanup(func() { close(stop); spinning.Wait() })
}

// TestTryAcquireAfterAWaitersTurn: a waiter takes the seat its holder
// gives back, releases it, and a TryAcquire next finds the semaphore free,
// round after round, while every core is kept busy. (Issue 19, defect 3:
// the waiter's entry in the fleet-wide line stayed in Redis after a local
// hand-over until the line's goroutine took it out; on a busy machine that
// came after the TryAcquire, which then saw a waiter ahead of it and
// returned nil on a free semaphore.)
func TestTryAcquireAfterAWaitersTurn(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client())
	ctx := context.Background()
	keepCoresBusy(t)
	rounds := 120
	if testing.Short() {
		rounds = 40
	}
	for round := range rounds {
		key := uniqueKey(t)
		holder, err := s.TryAcquire(ctx, key, 1)
		if err != nil || holder == nil {
			t.Fatalf("round %d: first TryAcquire on a fresh key: %v, %v", round, holder, err)
		}
		type result struct {
			p   *semaphore.Permit
			err error
		}
		got := make(chan result, 1)
		go func() {
			p, err := s.Acquire(ctx, key, 1, semaphore.WithWaitTimeout(20*time.Second))
			got <- result{p, err}
		}()
		waitfor.Condition(t, 10*time.Second, "the waiter waits", func() bool { return s.LocalWaiters(key) == 1 })
		if err := holder.Release(ctx); err != nil {
			t.Fatalf("round %d: release the holder: %v", round, err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("round %d: the waiter: %v", round, r.err)
		}
		if err := r.p.Release(ctx); err != nil {
			t.Fatalf("round %d: release the waiter's seat: %v", round, err)
		}
		p, err := s.TryAcquire(ctx, key, 1)
		if err != nil {
			t.Fatalf("round %d: TryAcquire: %v", round, err)
		}
		if p == nil {
			n, _ := srv.Client().ZCard(ctx, storeKey(key, "waiting")).Result()
			t.Fatalf("round %d: TryAcquire found no seat on a free semaphore (%d tokens waiting, %d seats used)", round, n, used(t, s, key))
		}
		if err := p.Release(ctx); err != nil {
			t.Fatalf("round %d: release: %v", round, err)
		}
	}
}
