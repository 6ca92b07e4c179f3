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
	s := newService(t, redis.NewClient(&redis.Options{Addr: m.Addr()}))
	ctx := context.Background()
	var mu sync.Mutex
	in, peak := 0, 0
	var wg sync.WaitGroup
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				p, err := s.Acquire(ctx, "embedded", 2, semaphore.WithWaitTimeout(10*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				in++
				peak = max(peak, in)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				mu.Lock()
				in--
				mu.Unlock()
				if p.Fence() == 0 {
					t.Error("a permit without a fence")
				}
				if err := p.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if peak > 2 {
		t.Errorf("cap exceeded: %d at once, capacity 2", peak)
	}
	if s.LocalHandOvers() == 0 {
		t.Error("no seat was handed over: the test did not run the hand-over")
	}
}
