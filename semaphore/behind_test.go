package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// TestCrowdOfWaitersCostsAFewCalls: 60 Acquire calls of one process wait
// on a full key of 2 seats and time out together. Only the first three join
// the room in Redis; the others wait behind them in the process, and a
// waiter that gives up hands its token to one behind it: the crowd costs
// Redis the calls of a few waiters, not two script calls each.
func TestCrowdOfWaitersCostsAFewCalls(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	ctx := context.Background()
	for range 2 {
		mustAcquire(t, s, key, 2, semaphore.WithTTL(time.Minute))
	}
	admin := srv.Client()
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const waiters = 60
	errs := make(chan error, waiters)
	for range waiters {
		go func() {
			_, err := s.Acquire(ctx, key, 2, semaphore.WithWaitTimeout(300*time.Millisecond))
			errs <- err
		}()
	}
	for range waiters {
		if err := <-errs; reasonOf(t, err) != semaphore.ReasonTimeout {
			t.Fatalf("a waiter on a full key: %v, want a timeout", err)
		}
	}
	total := 0
	for name, n := range redistest.CommandCalls(t, admin) {
		if name != "config|resetstat" {
			total += n
		}
	}
	// The joins, leaves and rechecks of the three that join (one more than
	// the capacity) come to 110-125 commands; 60 waiters that each join and
	// leave cost about 1,700, and without the hand-on of a token to the
	// waiter behind, 750-1,200.
	if total > 300 {
		t.Errorf("%d Redis commands for %d waiters that timed out, want at most 300", total, waiters)
	}
	for _, suffix := range []string{"waiting", "slots", "room"} {
		k := storeKey(key, suffix)
		if n, err := admin.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Errorf("%s left behind (%d, %v)", k, n, err)
		}
	}
}

// TestWaitersBehindKeepTheirArrival: a waiter that waited behind in its
// process joins the room with its own arrival, so it is served before a
// waiter of another process that came after it, though it joined later.
// On a key of one seat, two of a process's waiters join the room and the
// third waits behind them.
func TestWaitersBehindKeepTheirArrival(t *testing.T) {
	srv := redistest.Start(t)
	a, b := newService(t, srv.Client()), newService(t, srv.Client())
	key := uniqueKey(t)
	ctx := context.Background()
	holder := mustAcquire(t, newService(t, srv.Client()), key, 1, semaphore.WithTTL(time.Minute))
	waiting := storeKey(key, "waiting")
	inRoom := func(want int64) func() bool {
		return func() bool {
			n, err := srv.Client().ZCard(ctx, waiting).Result()
			return err == nil && n == want
		}
	}
	served := make(chan string, 4)
	kept := map[string]chan *semaphore.Permit{}
	wait := func(s *semaphore.Service, name string) {
		keep := make(chan *semaphore.Permit, 1)
		kept[name] = keep
		go func() {
			p, err := s.Acquire(ctx, key, 1, semaphore.WithWaitTimeout(20*time.Second))
			if err != nil {
				served <- name + ": " + err.Error()
				return
			}
			served <- name
			keep <- p
		}()
	}
	for i, name := range []string{"a1", "a2", "a3"} {
		wait(a, name)
		waitfor.Condition(t, 5*time.Second, name+" waits", func() bool { return a.LocalWaiters(key) == i+1 })
	}
	waitfor.Condition(t, 5*time.Second, "a1 and a2 in the room", inRoom(2))
	serverClockPasses(t, srv.Client(), 20*time.Millisecond)
	wait(b, "b1")
	waitfor.Condition(t, 5*time.Second, "b1 in the room, a3 still behind", inRoom(3))

	release := func(name string) {
		t.Helper()
		if err := (<-kept[name]).Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	next := func(want string) {
		t.Helper()
		if got := <-served; got != want {
			t.Fatalf("served %q, want %s", got, want)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next("a1")
	// a3 joins the room now that a1 is served, with its arrival before b1's.
	waitfor.Condition(t, 5*time.Second, "a3's late join", func() bool { return a.LateJoins(key) == 0 })
	waitfor.Condition(t, 5*time.Second, "a2, a3 and b1 in the room", inRoom(3))
	release("a1")
	next("a2")
	release("a2")
	next("a3")
	release("a3")
	next("b1")
	release("b1")
}
