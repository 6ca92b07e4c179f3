package semaphore_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// withSpares gives a Service n spare seats a key.
func withSpares(n int) func(*semaphore.Options) {
	return func(o *semaphore.Options) { o.SpareSeats = n }
}

// scriptCalls is how many scripts the server has run.
func scriptCalls(t *testing.T, rdb redis.UniversalClient) int {
	t.Helper()
	calls := redistest.CommandCalls(t, rdb)
	return calls["evalsha"] + calls["eval"]
}

// enterSeat is an Enter that must get a seat at once.
func enterSeat(t *testing.T, s *semaphore.Service, key string, capacity int, token string) *semaphore.Permit {
	t.Helper()
	e, err := s.Enter(context.Background(), key, capacity, token, roomOf(4), semaphore.WithAutoRenew(), semaphore.WithHolder(token))
	if err != nil {
		t.Fatalf("Enter %s: %v", token, err)
	}
	if e.Permit == nil {
		t.Fatalf("Enter %s found no free seat", token)
	}
	return e.Permit
}

// openSpares enters tasks of key until the Service holds spare seats of
// it (its first Enter starts its seat channel, and spare seats wait for
// it), and returns the seat held by the Enter that took them.
func openSpares(t *testing.T, s *semaphore.Service, key string, capacity int) *semaphore.Permit {
	t.Helper()
	var p *semaphore.Permit
	waitfor.Condition(t, 5*time.Second, "spare seats taken", func() bool {
		if p != nil {
			mustRelease(t, p)
		}
		p = enterSeat(t, s, key, capacity, "opener")
		return used(t, s, key) > 1
	})
	return p
}

func mustRelease(t *testing.T, p *semaphore.Permit) {
	t.Helper()
	if err := p.Release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// TestSpareSeatsLendWithoutRoundTrips: under a cap far from full, a
// Service takes spare seats with a seat, below half the capacity, and
// its next tasks take and give back seats without a script call; the
// spare seats show as one holder, and go back once idle.
func TestSpareSeatsLendWithoutRoundTrips(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client(), withSpares(8))
	key := uniqueKey(t)
	opener := openSpares(t, s, key, 100)
	if n := used(t, s, key); n != 9 {
		t.Fatalf("used seats = %d, want the seat and 8 spare", n)
	}
	holders, err := s.Holders(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	spare := 0
	for _, h := range holders {
		if strings.HasPrefix(h.Label, "spare:") {
			spare += h.Seats
		}
	}
	if spare != 8 {
		t.Fatalf("holders %+v: want one of 8 spare seats", holders)
	}
	before := scriptCalls(t, srv.Client())
	// One lent seat stays held throughout, so that the spare seats never
	// idle (a slow machine would otherwise see them go back between
	// rounds).
	anchor := enterSeat(t, s, key, 100, "anchor")
	for i := range 50 {
		var held []*semaphore.Permit
		for j := range 7 {
			held = append(held, enterSeat(t, s, key, 100, "t"+strconv.Itoa(i*7+j)))
		}
		for _, p := range held {
			mustRelease(t, p)
		}
	}
	mustRelease(t, anchor)
	if calls := scriptCalls(t, srv.Client()) - before; calls != 0 {
		t.Fatalf("351 tasks on spare seats ran %d scripts, want none", calls)
	}
	mustRelease(t, opener)
	waitfor.Condition(t, 5*time.Second, "idle spare seats given back", func() bool { return used(t, s, key) == 0 })
}

// TestSpareSeatsNeverTakeTheUpperHalf: spare seats come only from the
// lower half of a key's seats, and never from a small key.
func TestSpareSeatsNeverTakeTheUpperHalf(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client(), withSpares(8))
	key := uniqueKey(t)
	openSpares(t, s, key, 10)
	if n := used(t, s, key); n != 5 {
		t.Fatalf("used seats = %d, want the seat and 4 spare (half of 10)", n)
	}
	small := uniqueKey(t)
	for i := range 20 {
		p := enterSeat(t, s, small, 3, "s"+strconv.Itoa(i))
		if n := used(t, s, small); n != 1 {
			t.Fatalf("a key of 3 seats has %d used for one task: spare seats taken", n)
		}
		mustRelease(t, p)
	}
}

// TestSpareSeatsComeBackForAWaiter: when another Service's task finds the
// key full because of spare seats, they come back at once, and the
// waiting task gets one; the cap holds.
func TestSpareSeatsComeBackForAWaiter(t *testing.T) {
	srv := redistest.Start(t)
	a := newService(t, srv.Client(), withSpares(8))
	b := newService(t, srv.Client())
	key := uniqueKey(t)
	const capacity = 10
	openSpares(t, a, key, capacity) // 1 seat and 4 spare
	var held []*semaphore.Permit
	for i := range 5 {
		held = append(held, enterSeat(t, b, key, capacity, "b"+strconv.Itoa(i)))
	}
	e, err := b.Enter(context.Background(), key, capacity, "waiter", roomOf(4), semaphore.WithAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	if e.Permit != nil || !e.Standby {
		t.Fatalf("a full key gave %+v, want a standby place", e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := e.Wait(ctx)
	if err != nil {
		t.Fatalf("the waiter got no seat from the spare seats: %v", err)
	}
	if n := used(t, a, key); n > capacity {
		t.Fatalf("used seats = %d, over the cap of %d", n, capacity)
	}
	// The other spare seats went back with the one it got.
	if n := used(t, a, key); n != 7 {
		t.Fatalf("used seats = %d, want the opener's, 5 and the waiter's", n)
	}
	mustRelease(t, p)
	for _, h := range held {
		mustRelease(t, h)
	}
}

// TestSpareSeatsHoldTheCap: several Services with spare seats and busy
// tasks, more than the cap and fewer: never more seats held than the cap,
// and every task runs.
func TestSpareSeatsHoldTheCap(t *testing.T) {
	for _, capacity := range []int{12, 16, 40} {
		t.Run(strconv.Itoa(capacity), func(t *testing.T) { spareSeatsHoldTheCap(t, capacity) })
	}
}

func spareSeatsHoldTheCap(t *testing.T, capacity int) {
	srv := redistest.Start(t)
	key := uniqueKey(t)
	const perService, rounds = 6, 40
	// A parked task comes back when its token is let out.
	var wakes sync.Map // token -> chan struct{}
	wakeOf := func(token string) chan struct{} {
		c, _ := wakes.LoadOrStore(token, make(chan struct{}, 1))
		return c.(chan struct{})
	}
	onWake := func(o *semaphore.Options) {
		o.OnWake = func(_ string, tokens []string) {
			for _, tok := range tokens {
				select {
				case wakeOf(tok) <- struct{}{}:
				default:
				}
			}
		}
	}
	var services []*semaphore.Service
	for range 3 {
		services = append(services, newService(t, srv.Client(), withSpares(perService), onWake))
	}
	var mu sync.Mutex
	running, peak, done := 0, 0, 0
	errs := make(chan error, len(services)*perService)
	var wg sync.WaitGroup
	for si, s := range services {
		for g := range perService {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range rounds {
					token := strconv.Itoa(si) + "-" + strconv.Itoa(g) + "-" + strconv.Itoa(r)
					e, err := s.Enter(context.Background(), key, capacity, token, roomOf(100), semaphore.WithAutoRenew())
					for err == nil && e.Permit == nil && !e.Standby {
						select {
						case <-wakeOf(token):
						case <-time.After(10 * time.Second):
							errs <- errors.New("a parked task was not let out within 10s")
							return
						}
						e, err = s.Enter(context.Background(), key, capacity, token, roomOf(100), semaphore.WithAutoRenew())
					}
					if err != nil {
						errs <- err
						return
					}
					p := e.Permit
					if p == nil {
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						p, err = e.Wait(ctx)
						cancel()
						if err != nil {
							errs <- err
							return
						}
					}
					if err := e.Settle(context.Background()); err != nil { // the task starts
						errs <- err
						return
					}
					mu.Lock()
					running++
					peak = max(peak, running)
					mu.Unlock()
					time.Sleep(time.Millisecond) // the work
					mu.Lock()
					running--
					done++
					mu.Unlock()
					if err := p.Release(context.Background()); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if peak > capacity {
		t.Fatalf("%d tasks held a seat at once, over the cap of %d", peak, capacity)
	}
	if want := len(services) * perService * rounds; done != want {
		t.Fatalf("%d tasks ran, want %d", done, want)
	}
}

// TestSpareSeatFences: a seat lent from spare seats draws a fence above
// those granted before; once its spare seats are gone, its fence is 0.
func TestSpareSeatFences(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client(), withSpares(4))
	key := uniqueKey(t)
	opener := openSpares(t, s, key, 100)
	lent := enterSeat(t, s, key, 100, "lent")
	if lent.Fence() <= opener.Fence() {
		t.Fatalf("lent seat's fence %d, not above the earlier %d", lent.Fence(), opener.Fence())
	}
	if again := lent.Fence(); again != lent.Fence() {
		t.Fatalf("the fence changed between calls")
	}
	late := enterSeat(t, s, key, 100, "late")
	if _, err := s.ForceReleaseAll(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if f := late.Fence(); f != 0 {
		t.Fatalf("a seat whose spare seats were force-released drew fence %d, want 0", f)
	}
}

// TestSpareSeatsGoWithForceRelease: ForceReleaseAll takes spare seats
// too; the tasks on them learn it at once (not at the next renewal, a
// third of the 30 s lease away), their release says the seat was not
// held, and no seat is lent from them again.
func TestSpareSeatsGoWithForceRelease(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client(), withSpares(4))
	key := uniqueKey(t)
	openSpares(t, s, key, 100)
	lent := enterSeat(t, s, key, 100, "lent")
	if _, err := s.ForceReleaseAll(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lent.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a seat on force-released spare seats was not lost within 5s")
	}
	if err := lent.Release(context.Background()); !errors.Is(err, semaphore.ErrPermitNotHeld) {
		t.Fatalf("release of a force-released lent seat: %v, want ErrPermitNotHeld", err)
	}
	p := enterSeat(t, s, key, 100, "after")
	if n := used(t, s, key); n < 1 {
		t.Fatalf("a seat taken after the force release is not held in Redis (used %d): lent from gone spare seats", n)
	}
	mustRelease(t, p)
}

// TestSpareSeatsStopLendingWithoutRenewals: once Redis is gone, the spare
// seats' renewals fail, and within their lease the Service lends none:
// an Enter then asks the store, and fails.
func TestSpareSeatsStopLendingWithoutRenewals(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client(), withSpares(4), func(o *semaphore.Options) { o.DefaultTTL = 600 * time.Millisecond })
	key := uniqueKey(t)
	openSpares(t, s, key, 100)
	srv.Kill()
	killed := time.Now()
	var lent []*semaphore.Permit
	lastLent := killed
	waitfor.Condition(t, 10*time.Second, "an Enter that asks the dead store", func() bool {
		e, err := s.Enter(context.Background(), key, 100, "after", roomOf(4), semaphore.WithAutoRenew())
		if err == nil && e.Permit != nil {
			lent = append(lent, e.Permit)
			lastLent = time.Now()
			return false
		}
		return err != nil
	})
	if took := lastLent.Sub(killed); took > 600*time.Millisecond {
		t.Fatalf("a seat was lent %s after Redis went away, past the spare seats' 600ms lease", took)
	}
	for _, p := range lent {
		_ = p.Release(context.Background()) // the store is gone: the seats lapse
	}
}

// TestSpareSeatsGoBackAtClose: Close gives back the spare seats no task
// uses before it returns; a seat still held stays held.
func TestSpareSeatsGoBackAtClose(t *testing.T) {
	srv := redistest.Start(t)
	s, err := semaphore.New(srv.Client(), semaphore.Options{SpareSeats: 8})
	if err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t)
	opener := openSpares(t, s, key, 100)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := used(t, s, key); n != 1 {
		t.Fatalf("after Close %d seats are used, want the opener's only", n)
	}
	mustRelease(t, opener)
}

// TestSpareSeatsGoBackWhenTheSeatChannelIsLost: a Service whose seat
// channel is cut could miss the message that recalls its spare seats, so
// it gives back those no task uses at once; a lent seat still held stays
// held.
func TestSpareSeatsGoBackWhenTheSeatChannelIsLost(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client(), withSpares(8))
	key := uniqueKey(t)
	opener := openSpares(t, s, key, 100)
	// A lent seat held throughout keeps the spare seats from idling back:
	// only the lost channel may bring them back here.
	anchor := enterSeat(t, s, key, 100, "anchor")
	if n := used(t, s, key); n != 9 {
		t.Fatalf("used seats = %d, want the opener's and 8 spare", n)
	}
	if err := srv.Client().ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 5*time.Second, "the unused spare seats given back", func() bool { return used(t, s, key) == 2 })
	mustRelease(t, anchor)
	mustRelease(t, opener)
	if n := used(t, s, key); n != 0 {
		t.Fatalf("used seats = %d after every seat was released", n)
	}
}

// TestSpareSeatsComeBackForAParkedTask: a producer's task parked on a key
// that busy spare seats fill (Park, into a room with no standby place)
// calls them back, as a task that stands by does: the next spare seat that
// finishes goes back to the key, and lets the parked task out.
func TestSpareSeatsComeBackForAParkedTask(t *testing.T) {
	srv := redistest.Start(t)
	woken := make(wakeLog, 4)
	a := newService(t, srv.Client(), withSpares(8), woken.option)
	b := newService(t, srv.Client(), woken.option)
	key := uniqueKey(t)
	const capacity = 10
	held := []*semaphore.Permit{openSpares(t, a, key, capacity)} // 1 seat and 4 spare
	// Lent from the spare seats: busy, so they do not idle back.
	for i := range 4 {
		held = append(held, enterSeat(t, a, key, capacity, "a"+strconv.Itoa(i)))
	}
	for i := range 5 {
		held = append(held, enterSeat(t, b, key, capacity, "b"+strconv.Itoa(i)))
	}
	if n := used(t, a, key); n != capacity {
		t.Fatalf("used seats = %d, want the key full (%d)", n, capacity)
	}
	if _, err := b.Park(context.Background(), key, capacity, "parked", roomOf(0)); err != nil {
		t.Fatal(err)
	}
	woken.none(t)
	mustRelease(t, held[1]) // a spare seat, lent out
	if token := woken.next(t); token != "parked" {
		t.Fatalf("let out %q, want the parked task", token)
	}
	for _, h := range held[2:] {
		mustRelease(t, h)
	}
	mustRelease(t, held[0])
}

// TestSpareSeatsKeepNothingOfTheirTasks: a Service lends spare seats to
// task after task for as long as they are in use; what it keeps per lent
// seat goes with the seat. (A lent seat's loss was once a context derived
// from the spare seats', which kept every lent seat in it: about 115 bytes
// a task, for as long as the spare seats stayed lent.)
func TestSpareSeatsKeepNothingOfTheirTasks(t *testing.T) {
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	s, key := newService(t, redistest.Start(t).Client(), withSpares(8)), uniqueKey(t)
	opener := openSpares(t, s, key, 100)
	// One lent seat stays held throughout, so that the spare seats never
	// idle and go back.
	anchor := enterSeat(t, s, key, 100, "anchor")
	const tasks = 50000
	before := heap()
	for i := range tasks {
		p := enterSeat(t, s, key, 100, "t"+strconv.Itoa(i))
		p.AfterLost(func() {}) // as a worker's task does while it runs
		mustRelease(t, p)
	}
	grown := heap() - before
	mustRelease(t, anchor)
	mustRelease(t, opener)
	if grown > 1<<20 {
		t.Fatalf("the heap grew by %d bytes over %d tasks on spare seats (%d a task), want it flat", grown, tasks, grown/tasks)
	}
}

// TestSpareSeatReleaseRetriedAfterAStoreError: a seat lent from spare
// seats that are going back (the seat channel was lost) is released while
// the store cannot be reached: Release fails, and the caller releases it
// again once the store is back. The seat counts as given back once: the
// spare seats keep, on the store, the one another task still runs on.
func TestSpareSeatReleaseRetriedAfterAStoreError(t *testing.T) {
	srv := redistest.Start(t)
	rdb, proxy := proxied(t, srv, 0)
	s, key := newService(t, rdb, withSpares(8)), uniqueKey(t)
	opener := openSpares(t, s, key, 100)
	first, second := enterSeat(t, s, key, 100, "first"), enterSeat(t, s, key, 100, "second")
	// The channel is lost: the unused spare seats go back, the two lent
	// ones stay until their tasks end.
	if err := srv.Client().ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 5*time.Second, "the unused spare seats given back", func() bool { return used(t, s, key) == 3 })
	proxy.Cut()
	if err := first.Release(context.Background()); err == nil {
		t.Fatal("Release with the store cut off reported no error")
	}
	proxy.Restore()
	mustRelease(t, first)
	if n := used(t, s, key); n != 2 {
		t.Fatalf("used seats = %d after the retried Release, want 2: the opener's, and the one the second task runs on", n)
	}
	mustRelease(t, second)
	mustRelease(t, opener)
	if n := used(t, s, key); n != 0 {
		t.Fatalf("used seats = %d after every seat was released", n)
	}
}
