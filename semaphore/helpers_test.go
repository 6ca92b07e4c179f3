package semaphore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

var keySeq atomic.Int64

// uniqueKey names a semaphore no other test uses.
func uniqueKey(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), keySeq.Add(1))
}

// storeKey is the Redis key of part (holders, waiting, procs, ...) of the
// semaphore key, under the default prefix.
func storeKey(key, part string) string { return semaphore.DefaultPrefix + "{" + key + "}:" + part }

// newService returns a Service on its own client of srv, closed at test end.
func newService(t *testing.T, rdb redis.UniversalClient, opts ...func(*semaphore.Options)) *semaphore.Service {
	t.Helper()
	var o semaphore.Options
	for _, f := range opts {
		f(&o)
	}
	s, err := semaphore.New(rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustAcquire(t *testing.T, s *semaphore.Service, key string, permits int, opts ...semaphore.AcquireOption) *semaphore.Permit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := s.Acquire(ctx, key, permits, opts...)
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return p
}

func used(t *testing.T, s *semaphore.Service, key string) int {
	t.Helper()
	n, err := s.UsedPermits(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fillAllSeats checks that capacity holders, spread over services, can hold
// every seat of key at once: each takes a seat and keeps it until all have
// one. It fails if the semaphore admits fewer (they would wait for ever).
func fillAllSeats(t *testing.T, services []*semaphore.Service, key string, capacity int) {
	t.Helper()
	var holding sync.WaitGroup
	holding.Add(capacity)
	allIn := make(chan struct{})
	errs := make(chan error, capacity)
	var done sync.WaitGroup
	for i := range capacity {
		s := services[i%len(services)]
		done.Add(1)
		go func() {
			defer done.Done()
			p, err := s.Acquire(context.Background(), key, capacity, semaphore.WithWaitTimeout(10*time.Second))
			if err != nil {
				errs <- err
				holding.Done()
				return
			}
			holding.Done()
			<-allIn
			errs <- p.Release(context.Background())
		}()
	}
	holding.Wait()
	close(allIn)
	done.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("%d seats of %q could not all be held at once: %v", capacity, key, err)
		}
	}
}

// acquireInLine starts an Acquire of one seat of key (capacity 1) in the
// background and waits until it stands in s's local line; the permit (nil
// on error, reported) comes on the channel.
func acquireInLine(t *testing.T, s *semaphore.Service, key string, opts ...semaphore.AcquireOption) <-chan *semaphore.Permit {
	t.Helper()
	return acquireInLineOf(t, s, key, 1, opts...)
}

// acquireInLineOf is acquireInLine on a key of capacity permits.
func acquireInLineOf(t *testing.T, s *semaphore.Service, key string, permits int, opts ...semaphore.AcquireOption) <-chan *semaphore.Permit {
	t.Helper()
	got := make(chan *semaphore.Permit, 1)
	report := reporter(t)
	go func() {
		q, err := s.Acquire(context.Background(), key, permits, append([]semaphore.AcquireOption{semaphore.WithWaitTimeout(10 * time.Second)}, opts...)...)
		report(err)
		got <- q
	}()
	waitfor.Condition(t, 5*time.Second, "waiter in line", func() bool { return s.LocalWaiters(key) == 1 })
	return got
}

// reporter returns what a goroutine of the test reports its error with
// (nil: none): on t, unless the test is ending. A goroutine whose wait
// ends as the test's Services close (the test stopped before it took
// what the goroutine waited for) must not report after the test
// completed, which panics; while it reports, the test does not end.
func reporter(t *testing.T) func(error) {
	var mu sync.Mutex
	ending := false
	t.Cleanup(func() {
		mu.Lock()
		ending = true
		mu.Unlock()
	})
	return func(err error) {
		if err == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !ending {
			t.Error(err)
		}
	}
}

// serverClockPasses waits until the Redis server's clock has moved d past
// its reading now.
func serverClockPasses(t *testing.T, rdb redis.UniversalClient, d time.Duration) {
	t.Helper()
	now := func() time.Time {
		tm, err := rdb.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	until := now().Add(d)
	waitfor.Condition(t, 5*time.Second, "server clock moves on", func() bool { return !now().Before(until) })
}

// seatCounter counts, apart from the semaphore, how many callers of each
// key work at once, and the most seen.
type seatCounter struct {
	mu             sync.Mutex
	inflight, peak map[string]int
}

func (c *seatCounter) enter(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight[key]++
	c.peak[key] = max(c.peak[key], c.inflight[key])
}

func (c *seatCounter) leave(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight[key]--
}

// peakOf is the most callers of key seen at work at once.
func (c *seatCounter) peakOf(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peak[key]
}

// cycles runs perService goroutines on every Service; goroutine g takes a
// seat of keyOf(g) (capacity seats) rounds times with WithPermit and runs
// work while it holds it, counted by the returned seatCounter. It returns
// when every goroutine is done; a failed WithPermit fails the test.
func cycles(t *testing.T, services []*semaphore.Service, perService, rounds, capacity int, keyOf func(g int) string, work func()) *seatCounter {
	t.Helper()
	c := &seatCounter{inflight: map[string]int{}, peak: map[string]int{}}
	var wg sync.WaitGroup
	for _, s := range services {
		for g := range perService {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := keyOf(g)
				for range rounds {
					err := s.WithPermit(context.Background(), key, capacity, func(context.Context) error {
						c.enter(key)
						defer c.leave(key)
						work()
						return nil
					}, semaphore.WithWaitTimeout(30*time.Second))
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	return c
}
