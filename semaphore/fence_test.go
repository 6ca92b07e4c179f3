package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// fences records the fences of a key's seats in the order they were
// granted, and fails the test when one is not above every one before it.
type fences struct {
	t    *testing.T
	last uint64
	seen int
}

func (f *fences) add(how string, p *semaphore.Permit) {
	f.t.Helper()
	if p.Fence() <= f.last {
		f.t.Errorf("%s: fence %d after %d: want it above every fence before", how, p.Fence(), f.last)
	}
	f.last = p.Fence()
	f.seen++
}

// TestFencesGrowAcrossServices: seats taken in turn by two Services, free
// or handed to a waiter of the other Service, carry growing fences.
func TestFencesGrowAcrossServices(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a, b := newService(t, srv.Client()), newService(t, srv.Client())
	key := uniqueKey(t)
	f := &fences{t: t}
	for i := range 10 {
		first, second := a, b
		if i%2 == 1 {
			first, second = b, a
		}
		p := mustAcquire(t, first, key, 1)
		f.add("a free seat", p)
		got := acquireInLine(t, second, key)
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		q := <-got
		if q == nil {
			t.FailNow()
		}
		f.add("a seat handed to a waiter of the other Service", q)
		if err := q.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if f.seen != 20 {
		t.Fatalf("%d fences seen, want 20", f.seen)
	}
}

// TestFencesGrowAcrossAnIdleSpell: once every key of the semaphore has
// expired, the next seat's fence is still above the last one.
func TestFencesGrowAcrossAnIdleSpell(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	f := &fences{t: t}
	for range 3 {
		p := mustAcquire(t, s, key, 2, semaphore.WithTTL(50*time.Millisecond))
		f.add("before the idle spell", p)
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Condition(t, 10*time.Second, "every key of the semaphore expires", func() bool {
		keys, err := srv.Client().Keys(ctx, "*"+key+"*").Result()
		return err == nil && len(keys) == 0
	})
	f.add("after the idle spell", mustAcquire(t, s, key, 2))
}

// TestFenceGrowsPastALapsedHolder: a holder whose lease lapsed keeps its
// Permit and its fence; the seat's next holder has a greater one, which a
// resource uses to refuse the first holder's late writes.
func TestFenceGrowsPastALapsedHolder(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	paused := mustAcquire(t, s, key, 1, semaphore.WithTTL(100*time.Millisecond))
	f := &fences{t: t}
	f.add("the holder that pauses", paused)
	next := mustAcquire(t, s, key, 1, semaphore.WithWaitTimeout(5*time.Second))
	f.add("the next holder, once the first lease lapsed", next)
	if paused.Fence() >= next.Fence() {
		t.Fatalf("the lapsed holder's fence %d is not below the next holder's %d", paused.Fence(), next.Fence())
	}
}
