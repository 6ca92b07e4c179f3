package semaphore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/semaphore"
)

// TestContendedKeyOnTheEmbeddedRedis: the worker's embedded default runs
// on miniredis, whose Lua is not Redis's. Twelve callers of one process
// share 2 seats there, so that every path runs on it: the quick path,
// joins, waiting behind, the hand-over in memory and its move, fences.
// The cap holds and every permit has a fence.
func TestContendedKeyOnTheEmbeddedRedis(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	s := newService(t, rdb)
	const key = "embedded"
	ctx := context.Background()
	seats := &seatCounter{inflight: map[string]int{}, peak: map[string]int{}}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				p, err := s.Acquire(ctx, key, 2, semaphore.WithWaitTimeout(10*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				seats.enter(key)
				time.Sleep(2 * time.Millisecond) // the work done holding the seat
				seats.leave(key)
				if p.Fence() == 0 {
					t.Error("a permit without a fence")
				}
				if err := p.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	// Twelve waiters of one process on 2 seats: three join the room, the
	// others wait behind them for most of the run.
	mostBehind := 0
	for tick := time.NewTicker(time.Millisecond); ; {
		mostBehind = max(mostBehind, s.WaitingBehind(key))
		select {
		case <-tick.C:
			continue
		case <-done:
			tick.Stop()
		}
		break
	}
	if peak := seats.peakOf(key); peak > 2 {
		t.Errorf("cap exceeded: %d at once, capacity 2", peak)
	}
	if mostBehind == 0 {
		t.Error("no waiter was seen waiting behind: the test did not run waiting behind")
	}
	if s.LocalHandOvers() == 0 {
		t.Error("no seat was handed over: the test did not run the hand-over")
	}
}
