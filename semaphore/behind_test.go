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
// on a full key of 2 seats and time out together. Only the first two join
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
	for name, n := range commandCalls(t, admin) {
		if name != "config|resetstat" {
			total += n
		}
	}
	// Two waiters' joins, leaves and rechecks come to about 60 commands;
	// 60 waiters that each join and leave cost about 1,700.
	if total > 300 {
		t.Errorf("%d Redis commands for %d waiters that timed out, want at most 300", total, waiters)
	}
	for _, suffix := range []string{"waiting", "slots", "room"} {
		k := "fleetcap:sem:{" + key + "}:" + suffix
		if n, err := admin.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Errorf("%s left behind (%d, %v)", k, n, err)
		}
	}
}

// TestWaitersBehindKeepTheirArrival: a waiter that waited behind in its
// process joins the room with its own arrival, so it is served before a
// waiter of another process that came after it, though it joined later.
func TestWaitersBehindKeepTheirArrival(t *testing.T) {
	srv := redistest.Start(t)
	a, b := newService(t, srv.Client()), newService(t, srv.Client())
	key := uniqueKey(t)
	ctx := context.Background()
	holder := mustAcquire(t, newService(t, srv.Client()), key, 1, semaphore.WithTTL(time.Minute))
	served := make(chan string, 3)
	wait := func(s *semaphore.Service, name string, keep chan *semaphore.Permit) {
		p, err := s.Acquire(ctx, key, 1, semaphore.WithWaitTimeout(20*time.Second))
		if err != nil {
			served <- name + ": " + err.Error()
			return
		}
		served <- name
		keep <- p
	}
	a1, a2, b1 := make(chan *semaphore.Permit, 1), make(chan *semaphore.Permit, 1), make(chan *semaphore.Permit, 1)
	go wait(a, "a1", a1)
	waitfor.Condition(t, 5*time.Second, "a1 in line", func() bool { return a.LocalWaiters(key) == 1 })
	go wait(a, "a2", a2) // behind a1, in a's process
	waitfor.Condition(t, 5*time.Second, "a2 in line", func() bool { return a.LocalWaiters(key) == 2 })
	serverClockPasses(t, srv.Client(), 20*time.Millisecond)
	go wait(b, "b1", b1)
	waitfor.Condition(t, 5*time.Second, "b1 in line", func() bool { return b.LocalWaiters(key) == 1 })

	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-served; got != "a1" {
		t.Fatalf("served first %q, want a1", got)
	}
	// a2 joins the room now that a1 is served; then a1's seat frees.
	waiting := "fleetcap:sem:{" + key + "}:waiting"
	waitfor.Condition(t, 5*time.Second, "a2 and b1 in the room", func() bool {
		n, err := srv.Client().ZCard(ctx, waiting).Result()
		return err == nil && n == 2
	})
	if err := (<-a1).Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-served; got != "a2" {
		t.Fatalf("served second %q, want a2, which came before b1", got)
	}
	if err := (<-a2).Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-served; got != "b1" {
		t.Fatalf("served third %q, want b1", got)
	}
	if err := (<-b1).Release(ctx); err != nil {
		t.Fatal(err)
	}
}
