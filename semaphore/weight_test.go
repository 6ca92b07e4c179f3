package semaphore_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
	"github.com/redis/go-redis/v9"
)

// TestWeightedSeats: a permit of weight n takes n seats: UsedPermits
// counts seats, Holders one holder, and its seats are extended and given
// back together. A weight outside 1..permits is a bad argument.
func TestWeightedSeats(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	heavy := mustAcquire(t, s, key, 5, semaphore.WithWeight(3), semaphore.WithTTL(300*time.Millisecond), semaphore.WithHolder("heavy"))
	if n := used(t, s, key); n != 3 || heavy.Weight() != 3 {
		t.Fatalf("used %d, weight %d: want 3 seats for a permit of weight 3", n, heavy.Weight())
	}
	holders, err := s.Holders(ctx, key)
	if err != nil || len(holders) != 1 || holders[0].Label != "heavy" {
		t.Fatalf("holders %v (%v): want the one heavy holder", holders, err)
	}
	if p, err := s.TryAcquire(ctx, key, 5, semaphore.WithWeight(3)); p != nil || err != nil {
		t.Fatalf("a second weight 3 on 2 free seats: (%v, %v), want (nil, nil)", p, err)
	}
	light, err := s.TryAcquire(ctx, key, 5, semaphore.WithWeight(2))
	if light == nil || err != nil {
		t.Fatalf("weight 2 on 2 free seats: (%v, %v)", light, err)
	}
	// Extended past its first lease, all three seats stay held.
	if err := heavy.Extend(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	serverClockPasses(t, srv.Client(), 400*time.Millisecond)
	if n := used(t, s, key); n != 5 {
		t.Fatalf("used %d after the weight-3 permit was extended past its first lease, want 5", n)
	}
	if err := heavy.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := used(t, s, key); n != 2 {
		t.Fatalf("used %d after the weight-3 permit was released, want 2", n)
	}
	for _, c := range []struct {
		opt  semaphore.AcquireOption
		want string
	}{
		{semaphore.WithWeight(0), "weight must be >= 1"},
		{semaphore.WithWeight(6), "weight 6 is more than the 5 permits"},
	} {
		if _, err := s.TryAcquire(ctx, key, 5, c.opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("TryAcquire: %v, want an error saying %q", err, c.want)
		}
	}
}

// TestHeavyWaiterIsNotOvertaken: a waiter of weight 3 at the head of the
// line is served before the light waiters that came after it, however many
// single seats free meanwhile; then they are served.
func TestHeavyWaiterIsNotOvertaken(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a, b := newService(t, srv.Client()), newService(t, srv.Client())
	key := uniqueKey(t)
	const permits = 4
	held := make([]*semaphore.Permit, permits)
	for i := range held {
		held[i] = mustAcquire(t, a, key, permits)
	}
	type seat struct {
		who string
		p   *semaphore.Permit
	}
	seats := make(chan seat, 3)
	wait := func(s *semaphore.Service, who string, weight int) {
		go func() {
			p, err := s.Acquire(ctx, key, permits, semaphore.WithWeight(weight), semaphore.WithWaitTimeout(20*time.Second))
			if err != nil {
				t.Error(who, err)
			}
			seats <- seat{who, p}
		}()
	}
	wait(b, "heavy", 3)
	waitfor.Condition(t, 5*time.Second, "the heavy waiter in line", func() bool { return b.LocalWaiters(key) == 1 })
	wait(a, "light-1", 1)
	wait(b, "light-2", 1)
	waitfor.Condition(t, 5*time.Second, "the light waiters in line", func() bool { return a.LocalWaiters(key)+b.LocalWaiters(key) == 3 })
	// Two seats free: not enough for the heavy waiter, and the light ones
	// wait behind it.
	for _, p := range held[:2] {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := a.TryAcquire(ctx, key, permits); p != nil || err != nil {
		t.Fatalf("TryAcquire with a heavy waiter first: (%v, %v), want (nil, nil)", p, err)
	}
	select {
	case s := <-seats:
		t.Fatalf("%s took a seat while the heavy waiter waited for 3 of 2 free", s.who)
	default:
	}
	if err := held[2].Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := <-seats
	if first.who != "heavy" || first.p == nil {
		t.Fatalf("%s was served first, want the heavy waiter", first.who)
	}
	if n := used(t, a, key); n != permits {
		t.Fatalf("used %d, want %d (3 heavy + 1 light)", n, permits)
	}
	// Its seats and the last light one free: the light waiters follow.
	if err := first.p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		s := <-seats
		if s.p == nil {
			t.FailNow()
		}
		if err := s.p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = held[3].Release(ctx)
}

// TestWeightedSeatsNeverExceedTheCapacity: callers of weights 1 to 3 on two
// Services never hold more seats at once than the permits.
func TestWeightedSeatsNeverExceedTheCapacity(t *testing.T) {
	srv := redistest.Start(t)
	services := []*semaphore.Service{newService(t, srv.Client()), newService(t, srv.Client())}
	key := uniqueKey(t)
	const permits = 5
	var mu sync.Mutex
	inflight, peak, served := 0, 0, 0
	var wg sync.WaitGroup
	for i, s := range services {
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(i), uint64(g)))
				for range 15 {
					weight := 1 + r.IntN(3)
					err := s.WithPermit(context.Background(), key, permits, func(context.Context) error {
						mu.Lock()
						inflight += weight
						peak = max(peak, inflight)
						served++
						mu.Unlock()
						time.Sleep(time.Duration(1+r.IntN(3)) * time.Millisecond)
						mu.Lock()
						inflight -= weight
						mu.Unlock()
						return nil
					}, semaphore.WithWeight(weight), semaphore.WithWaitTimeout(30*time.Second))
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if peak > permits || served != 2*6*15 {
		t.Fatalf("peak %d seats of %d, %d served of %d", peak, permits, served, 2*6*15)
	}
	t.Logf("peak %d of %d seats, %d served", peak, permits, served)
}

// TestGoneHeavyWaiterDoesNotHoldTheLine: a waiter of weight 2 first in
// line, whose process is no longer heard of, does not keep a seat that
// frees from the light waiter behind it (the seat would idle until a
// second one freed): it is passed over as any waiter of such a process
// is, whether or not its seats are free.
func TestGoneHeavyWaiterDoesNotHoldTheLine(t *testing.T) {
	srv := redistest.Start(t)
	ctx, rdb := context.Background(), srv.Client()
	s := newService(t, rdb)
	key := uniqueKey(t)
	const permits = 2
	first := mustAcquire(t, s, key, permits)
	second := mustAcquire(t, s, key, permits)
	defer func() { _ = second.Release(ctx) }()
	cut, proxy := proxied(t, srv, 2)
	gone := newService(t, cut)
	go func() {
		// It ends as its Service closes; what it returns does not matter.
		if p, err := gone.Acquire(ctx, key, permits, semaphore.WithWeight(2), semaphore.WithWaitTimeout(30*time.Second)); err == nil {
			_ = p.Release(ctx)
		}
	}()
	waitfor.Condition(t, 5*time.Second, "the heavy waiter waits", func() bool { return gone.LocalWaiters(key) == 1 })
	light := acquireInLineOf(t, s, key, permits)
	proxy.Cut()
	defer proxy.Restore() // for the gone Service's Close
	waitfor.Condition(t, 10*time.Second, "the gone process's presence lapses", func() bool {
		ago, ok := oldestLapse(rdb, key)
		return ok && ago >= 0 && rdb.ZCard(ctx, storeKey(key, "procs")).Val() == 2
	})
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	seatedThenRelease(t, light, "the light waiter got no seat: the gone process's heavy waiter holds the line")
}

// seatedThenRelease waits up to 5 s for the permit of an Acquire started
// with acquireInLine and gives it back; failing says why there is none.
func seatedThenRelease(t *testing.T, got <-chan *semaphore.Permit, failing string) {
	t.Helper()
	select {
	case p := <-got:
		if p == nil {
			t.FailNow() // its error is reported
		}
		if err := p.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal(failing)
	}
}

// TestUnreadableSlotLeavesTheLine: a waiting token whose slots entry this
// layout cannot read (one of layout 5, whose entries name no place, left
// by a process killed with its waiters in line) leaves the line when its
// turn comes, and the seat goes to the next waiter; the release does not
// fail on it.
func TestUnreadableSlotLeavesTheLine(t *testing.T) {
	srv := redistest.Start(t)
	ctx, rdb := context.Background(), srv.Client()
	s := newService(t, rdb)
	key := uniqueKey(t)
	first := mustAcquire(t, s, key, 1)
	if err := rdb.ZAdd(ctx, storeKey(key, "waiting"), redis.Z{Score: 1, Member: "old"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, storeKey(key, "slots"), "old", "gone-channel\tabc\t30000\t1\t1\told-label").Err(); err != nil {
		t.Fatal(err)
	}
	next := acquireInLine(t, s, key)
	if err := first.Release(ctx); err != nil {
		t.Fatalf("release with an unreadable waiter first in line: %v", err)
	}
	seatedThenRelease(t, next, "the waiter behind the unreadable one got no seat")
	if inRoom(t, rdb, key, "waiting", "old") || rdb.HExists(ctx, storeKey(key, "slots"), "old").Val() {
		t.Fatal("the unreadable waiter is still in line")
	}
}
