package semaphore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// TestFirstComeFirstServed: waiters of two processes (Services on their
// own clients) get a single seat in the order they came. Each holds its
// seat until no late join of a waiter behind (behind.go) is on the wire:
// a seat that turns over faster than that round trip may go to a later
// waiter of the other process.
func TestFirstComeFirstServed(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a, b := newService(t, srv.Client()), newService(t, srv.Client())
	key := uniqueKey(t)
	holder := mustAcquire(t, newService(t, srv.Client()), key, 1)

	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	services := []*semaphore.Service{a, b, a, b, a, b}
	for i, s := range services {
		before := s.LocalWaiters(key)
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := s.Acquire(ctx, key, 1, semaphore.WithWaitTimeout(20*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if !waitfor.Eventually(5*time.Second, func() bool { return a.LateJoins(key)+b.LateJoins(key) == 0 }) {
				t.Error("a late join of the room was still on the wire after 5s")
			}
			if err := p.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
		waitfor.Condition(t, 5*time.Second, "waiter in line", func() bool { return s.LocalWaiters(key) == before+1 })
		// A waiter's place is its arrival by the server's clock, which each
		// Service estimates to within a round trip: arrivals under a
		// millisecond apart may swap. Let the server's clock move on well
		// past that before the next one comes.
		serverClockPasses(t, srv.Client(), 20*time.Millisecond)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("served in order %v, want arrival order 0..%d", order, len(services)-1)
		}
	}
}

// TestWaiterWakesPromptly: a waiter whose backoff has grown long (it
// sleeps at least grown between attempts) still takes a seat within a few
// milliseconds of a release by another process, a force-release, or a
// lease expiry. The bound (100 ms) is far above the expected wake-up
// (about a millisecond) and far below the backoff the waiter would
// otherwise sleep out.
func TestWaiterWakesPromptly(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	holders, waiters := newService(t, srv.Client()), newService(t, srv.Client())
	const bound = 100 * time.Millisecond
	const grown = 400 * time.Millisecond

	free := map[string]func(key string, p *semaphore.Permit) time.Time{
		"release": func(key string, p *semaphore.Permit) time.Time {
			if err := p.Release(ctx); err != nil {
				t.Error(err)
			}
			return time.Now()
		},
		"force-release": func(key string, p *semaphore.Permit) time.Time {
			if _, err := holders.ForceReleaseAll(ctx, key); err != nil {
				t.Error(err)
			}
			return time.Now()
		},
		"expiry": func(key string, p *semaphore.Permit) time.Time {
			// The lease ends by the server's clock (loopback keeps ours
			// close), further ahead than the longest backoff: the waiter
			// learns of the new expiry on its next attempt and times its
			// next one by it.
			if err := p.Extend(ctx, 2500*time.Millisecond); err != nil {
				t.Error(err)
			}
			expires := p.ExpiresAt()
			time.Sleep(time.Until(expires)) // the event itself, not a hope
			return expires
		},
	}
	for name, freeSeat := range free {
		t.Run(name, func(t *testing.T) {
			key := uniqueKey(t)
			p := mustAcquire(t, holders, key, 1, semaphore.WithTTL(time.Minute))
			got := acquireInLine(t, waiters, key)
			waitfor.Condition(t, 10*time.Second, "the waiter's backoff grows", func() bool { return waiters.LineBackoff(key) >= grown })
			at := freeSeat(key, p)
			select {
			case q := <-got:
				lag := time.Since(at)
				if q == nil {
					t.FailNow() // acquireInLine reported the error
				}
				defer q.Release(ctx)
				if lag > bound {
					t.Fatalf("waiter took the seat %s after the %s", lag, name)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("waiter had no seat 10s after the %s", name)
			}
		})
	}
}

// TestNextWaiterWakesOnRelease: once the first of two waiters takes the
// last free seat, the second waits for a wake message instead of polling
// (its Service's backoff is at least 100 ms then); a release by another
// process must still hand it the next seat at once.
func TestNextWaiterWakesOnRelease(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	holders, waiters := newService(t, srv.Client()), newService(t, srv.Client())
	const bound = 80 * time.Millisecond // a wake takes about a millisecond
	key := uniqueKey(t)
	p1 := mustAcquire(t, holders, key, 2)
	p2 := mustAcquire(t, holders, key, 2)
	got := make(chan *semaphore.Permit, 2)
	for range 2 {
		go func() {
			q, err := waiters.Acquire(ctx, key, 2, semaphore.WithWaitTimeout(10*time.Second))
			if err != nil {
				t.Error(err)
			}
			got <- q
		}()
	}
	waitfor.Condition(t, 5*time.Second, "two waiters in line", func() bool { return waiters.LocalWaiters(key) == 2 })
	// passOn releases p and returns how long until a waiter had its seat.
	passOn := func(p *semaphore.Permit) time.Duration {
		released := time.Now()
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		q := <-got
		if q == nil {
			t.FailNow()
		}
		t.Cleanup(func() { _ = q.Release(ctx) })
		return time.Since(released)
	}
	passOn(p1) // the first waiter takes the last free seat
	if lag := passOn(p2); lag > bound {
		t.Fatalf("the second waiter took the seat %s after its release", lag)
	}
}

// TestClusterCap runs the semaphore on a 3-master Redis Cluster: the cap
// holds for several keys (in different slots) and waiters wake on release.
func TestClusterCap(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	keys := []string{"alpha", "bravo", "charlie", "delta"}
	const capacity = 3
	services := []*semaphore.Service{newService(t, cluster.Client(t)), newService(t, cluster.Client(t))}
	seats := cycles(t, services, 12, 8, capacity, func(g int) string { return keys[g%len(keys)] },
		func() { time.Sleep(2 * time.Millisecond) })
	for _, k := range keys {
		if n := seats.peakOf(k); n > capacity {
			t.Fatalf("key %s: %d at once, capacity %d", k, n, capacity)
		}
	}
	s := newService(t, cluster.Client(t))
	for _, k := range keys {
		fillAllSeats(t, []*semaphore.Service{s, newService(t, cluster.Client(t))}, k, capacity)
	}
	for _, k := range keys {
		if n := used(t, s, k); n != 0 {
			t.Fatalf("key %s: %d seats left held", k, n)
		}
	}
}

// TestLongWaitKeepsItsPresence: a waiter that waits long, its
// subscription heard (its rechecks as far apart as they get), keeps its
// process's presence in the room, with time to spare, at every moment: a
// seat freed then is never passed over as if its process were gone.
func TestLongWaitKeepsItsPresence(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	rdb := srv.Client()
	key := uniqueKey(t)
	holder := mustAcquire(t, newService(t, rdb), key, 1, semaphore.WithTTL(time.Minute))
	ws := newService(t, rdb)
	got := acquireInLine(t, ws, key)
	procs := storeKey(key, "procs")
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		presence, err := rdb.ZRangeWithScores(ctx, procs, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(presence) != 1 {
			t.Fatalf("%d presences in the room, want the waiter's process's", len(presence))
		}
		// The rechecks renew it (for 3s) at least every 1.5s: about 1.5s
		// of it is always left; half a second is, even with a second to
		// spare for a slow recheck.
		if b := ws.LineBackoff(key); b > 1500*time.Millisecond {
			t.Fatalf("the waiter's rechecks back off to %s, beyond half its presence's TTL (3s)", b)
		}
		if left := time.UnixMilli(int64(presence[0].Score)).Sub(now); left < 500*time.Millisecond {
			t.Fatalf("the waiting process's presence had %s left while it waited (backoff %s), want at least 0.5s", left, ws.LineBackoff(key))
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if p == nil {
			t.Fatal("the waiter got no seat")
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the seat freed did not reach the waiter within 5s")
	}
}
