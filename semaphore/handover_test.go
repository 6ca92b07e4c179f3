package semaphore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// TestLocalHandOverKeepsTheCap: two Services share a key whose waiters are
// mostly served by local hand-overs (the seat goes to a waiter in memory,
// the store learns of it one call later). An independent counter sees no
// more than the capacity at work at once, and the store never counts more
// holders than seats.
func TestLocalHandOverKeepsTheCap(t *testing.T) {
	srv := redistest.Start(t)
	const capacity, perService, rounds = 3, 10, 15
	key := uniqueKey(t)
	services := []*semaphore.Service{newService(t, srv.Client()), newService(t, srv.Client())}

	var storeMax atomic.Int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() { // the store's own count, polled for the whole run
		defer close(watched)
		raw := srv.Client()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := raw.ZCard(context.Background(), storeKey(key, "holders")).Result()
			if err == nil && n > storeMax.Load() {
				storeMax.Store(n)
			}
		}
	}()

	seats := cycles(t, services, perService, rounds, capacity, func(int) string { return key }, func() { time.Sleep(time.Millisecond) })
	close(stop)
	<-watched
	if m := seats.peakOf(key); m > capacity {
		t.Fatalf("cap exceeded: %d ran at once, capacity %d", m, capacity)
	}
	if m := storeMax.Load(); m > capacity {
		t.Fatalf("the store counted %d holders, capacity %d", m, capacity)
	}
	handed := services[0].LocalHandOvers() + services[1].LocalHandOvers()
	t.Logf("local hand-overs %d of %d cycles", handed, 2*perService*rounds)
	if handed == 0 {
		t.Fatal("no seat was handed over locally: the test did not exercise the path")
	}
	if n := used(t, services[0], key); n != 0 {
		t.Fatalf("%d seats still held after every release", n)
	}
}

// TestLocalHandOverMovesTheSeat: the new permit holds the seat on the
// store under its own ID and label, with its own lease, and renews it.
func TestLocalHandOverMovesTheSeat(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	p := mustAcquire(t, s, key, 1, semaphore.WithHolder("first"))

	got := acquireInLine(t, s, key, semaphore.WithHolder("second"), semaphore.WithTTL(300*time.Millisecond), semaphore.WithAutoRenew())
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q := <-got
	if q == nil {
		t.FailNow()
	}
	defer q.Release(ctx)
	if n := s.LocalHandOvers(); n != 1 {
		t.Fatalf("local hand-overs %d, want 1", n)
	}
	hs, err := s.Holders(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || hs[0].PermitID != q.ID() || hs[0].Label != "second" {
		t.Fatalf("holders %+v, want only %s labelled second", hs, q.ID())
	}
	if !hs[0].ExpiresAt.Equal(q.ExpiresAt()) || q.ExpiresAt().After(q.AcquiredAt().Add(300*time.Millisecond)) {
		t.Fatalf("lease %s..%s, store says %s", q.AcquiredAt(), q.ExpiresAt(), hs[0].ExpiresAt)
	}
	if !q.IsAutoRenewing() {
		t.Fatal("handed-over permit is not auto-renewing")
	}
	first := q.ExpiresAt()
	waitfor.Condition(t, 5*time.Second, "handed-over lease renewed past its first expiry", func() bool {
		return q.ExpiresAt().After(first.Add(100 * time.Millisecond))
	})
	if held, err := q.IsHeld(ctx); err != nil || !held {
		t.Fatalf("renewed seat not held: %v %v", held, err)
	}
	select {
	case <-q.Lost():
		t.Fatal("handed-over permit marked lost")
	default:
	}
}

// TestLocalHandOverOfALostSeat: the seat of a releasing permit was lost
// (here: it lapsed and another process took it, written straight into the
// store so that nothing tells the holder) while a waiter of its own
// Service stood first in line. The waiter gets the seat in memory at once;
// the move then finds it gone: the release reports ErrPermitNotHeld and
// the new permit is marked lost (the lost seat's holder ran one round trip
// too long, as any holder of a force-released seat does until it learns).
func TestLocalHandOverOfALostSeat(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	p := mustAcquire(t, s, key, 1)

	got := acquireInLine(t, s, key)
	// The intruder takes the seat in the same transaction: a seat free for
	// a moment would go to the waiter (its process's recheck may run then).
	intruder := redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "intruder"}
	if _, err := srv.Client().TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.ZRem(ctx, storeKey(key, "holders"), p.ID())
		tx.ZAdd(ctx, storeKey(key, "holders"), intruder)
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	if err := p.Release(ctx); !errors.Is(err, semaphore.ErrPermitNotHeld) {
		t.Fatalf("release of a lost seat: %v, want ErrPermitNotHeld", err)
	}
	q := <-got
	if q == nil {
		t.FailNow()
	}
	if n := s.LocalHandOvers(); n != 1 {
		t.Fatalf("local hand-overs %d, want 1", n)
	}
	select {
	case <-q.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the permit handed a lost seat is not marked lost")
	}
	if held, err := q.IsHeld(ctx); err != nil || held {
		t.Fatalf("IsHeld = %v, %v; want false", held, err)
	}
	if err := q.Release(ctx); !errors.Is(err, semaphore.ErrPermitNotHeld) {
		t.Fatalf("release of the lost hand-over: %v, want ErrPermitNotHeld", err)
	}
	hs, err := s.Holders(ctx, key)
	if err != nil || len(hs) != 1 || hs[0].PermitID != "intruder" {
		t.Fatalf("holders %+v (%v), want only the intruder", hs, err)
	}
}

// TestLocalHandOverKeepsArrivalOrder: a seat released by a process goes
// to its own waiter in memory only while that waiter stands first in
// line: of a's waiters w1 and w2, and b's x that came between them, a's
// release goes to w1 in memory, and w1's to x, not to a's own w2.
func TestLocalHandOverKeepsArrivalOrder(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a, b := newService(t, srv.Client()), newService(t, srv.Client())
	key := uniqueKey(t)
	holder := mustAcquire(t, a, key, 1)
	served := make(chan string, 3)
	hold := map[string]chan *semaphore.Permit{"w1": make(chan *semaphore.Permit, 1), "x": make(chan *semaphore.Permit, 1), "w2": make(chan *semaphore.Permit, 1)}
	for _, w := range []struct {
		s    *semaphore.Service
		name string
	}{{a, "w1"}, {b, "x"}, {a, "w2"}} {
		before := w.s.LocalWaiters(key)
		go func() {
			p, err := w.s.Acquire(ctx, key, 1, semaphore.WithWaitTimeout(10*time.Second))
			if err != nil {
				served <- w.name + ": " + err.Error()
				return
			}
			served <- w.name
			hold[w.name] <- p
		}()
		waitfor.Condition(t, 5*time.Second, w.name+" in line", func() bool { return w.s.LocalWaiters(key) == before+1 })
		serverClockPasses(t, srv.Client(), 20*time.Millisecond)
	}
	handed := a.LocalHandOvers()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"w1", "x", "w2"} {
		if got := <-served; got != want {
			t.Fatalf("served %q, want %s (arrival order w1, x, w2)", got, want)
		}
		if err := (<-hold[want]).Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.LocalHandOvers() - handed; n != 1 {
		t.Errorf("%d hand-overs in memory, want 1: a's release to w1 (w1's own release must go to x, of another process, through the store)", n)
	}
}

// TestBatchedCallsSurviveAScriptFlush: concurrent calls go out pipelined;
// after SCRIPT FLUSH every one of them still runs (EVALSHA answers
// NOSCRIPT, the batch sends EVAL).
func TestBatchedCallsSurviveAScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	for round := range 3 {
		if err := srv.Client().ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := s.TryAcquire(ctx, key, 100, semaphore.WithHolder("x"))
				if err != nil || p == nil {
					t.Errorf("round %d: (%v, %v)", round, p, err)
					return
				}
				if err := p.Release(ctx); err != nil {
					t.Errorf("round %d: release: %v", round, err)
				}
			}()
		}
		wg.Wait()
	}
	if n := used(t, s, key); n != 0 {
		t.Fatalf("used %d", n)
	}
}

// TestHolderLabelsAnyText: a label may hold any text, newlines included.
func TestHolderLabelsAnyText(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	label := "task\nwith newline\n"
	p := mustAcquire(t, s, key, 2, semaphore.WithHolder(label))
	hs, err := s.Holders(ctx, key)
	if err != nil || len(hs) != 1 || hs[0].PermitID != p.ID() || hs[0].Label != label {
		t.Fatalf("holders %+v (%v), want %s labelled %q", hs, err, p.ID(), label)
	}
	if err := p.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if held, err := p.IsHeld(ctx); err != nil || !held {
		t.Fatalf("IsHeld = %v, %v", held, err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := used(t, s, key); n != 0 {
		t.Fatalf("used %d", n)
	}
}

// TestKeySlot: the slots the batcher groups calls by on a cluster are the
// cluster's own (CLUSTER KEYSLOT), hash tags included.
func TestKeySlot(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	rdb := cluster.Client(t)
	ctx := context.Background()
	for _, k := range []string{"", "a", "foo", "123456789", "fleetcap:sem:{alpha}:holders", "{user1000}.following",
		"foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{}", "x{", "x}{y}", "päth/ü"} {
		want, err := rdb.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := semaphore.KeySlot(k); int64(got) != want {
			t.Errorf("slot of %q: %d, want %d", k, got, want)
		}
	}
}

// TestStandingTaskTakesItsSeatInMemory: a task standing by first in line
// gets the seat a task of its own process gives back at once, in memory:
// it holds it while the store is paused (CLIENT PAUSE), before the call
// that moves the seat can answer. The move gives the task's standby place
// on with the seat, and the token let out in it comes back only as the
// task settles, so that the slots waiting never outnumber the places; the
// store then holds the task's seat under its own permit, and only it.
func TestStandingTaskTakesItsSeatInMemory(t *testing.T) {
	srv, s, woken, key := wokenService(t)
	ctx := context.Background()
	p1, t2, seat2 := standingPair(t, s, woken, key)
	if err := srv.Client().Do(ctx, "CLIENT", "PAUSE", 10000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- p1.Release(ctx) }()
	var p2 *semaphore.Permit
	select {
	case p2 = <-seat2:
	case err := <-released:
		t.Fatalf("t1's release returned (%v) before t2 had its seat", err)
	case <-time.After(5 * time.Second):
		t.Fatal("t2 got no seat while the store was paused: it was not handed over in memory")
	}
	if p2 == nil {
		t.FailNow()
	}
	select {
	case err := <-released:
		t.Fatalf("t1's release returned (%v) while the store was paused", err)
	default:
	}
	if err := srv.Client().Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	if err := <-released; err != nil {
		t.Fatalf("t1's release: %v", err)
	}
	checkSeatMovedToT2(t, s, woken, key, p1, t2, p2)
}

// TestStandingTaskTakesItsSeatOnTheEmbeddedRedis: the same move runs on
// miniredis, whose Lua is not Redis's (the worker's embedded default).
func TestStandingTaskTakesItsSeatOnTheEmbeddedRedis(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	woken := make(wakeLog, 16)
	s, key := newService(t, rdb, woken.option), uniqueKey(t)
	p1, t2, seat2 := standingPair(t, s, woken, key)
	p2 := releaseToT2InMemory(t, s, p1, seat2)
	checkSeatMovedToT2(t, s, woken, key, p1, t2, p2)
}

// standingPair has t0 take key's seat (capacity 1, two standby places),
// t1 and t2 stand by, t3 and t4 park, and t0 give its seat back through
// the store (nothing said yet who is first in line): t1 holds it, and t3
// was let out in its place. It returns t1's permit, t2's Entry and where
// t2's seat comes.
func standingPair(t *testing.T, s *semaphore.Service, woken wakeLog, key string) (*semaphore.Permit, *semaphore.Entry, <-chan *semaphore.Permit) {
	t.Helper()
	s.TrustLineFor(time.Minute) // the steps may outlast the default under -race
	ctx, room, opt := context.Background(), workerRoom(2), semaphore.WithStartOnSeat()
	t0 := enter(t, s, key, 1, "t0", room, opt)
	t1, t2 := enter(t, s, key, 1, "t1", room, opt), enter(t, s, key, 1, "t2", room, opt)
	t3, t4 := enter(t, s, key, 1, "t3", room, opt), enter(t, s, key, 1, "t4", room, opt)
	if t0.Permit == nil || !t1.Standby || !t2.Standby || t3.Standby || t4.Standby {
		t.Fatal("want t0 seated, t1 and t2 standing by, t3 and t4 parked")
	}
	seat1, seat2 := make(chan *semaphore.Permit, 1), make(chan *semaphore.Permit, 1)
	report := reporter(t)
	for _, w := range []struct {
		e    *semaphore.Entry
		seat chan *semaphore.Permit
	}{{t1, seat1}, {t2, seat2}} {
		go func() {
			p, err := w.e.Wait(ctx, semaphore.WithWaitTimeout(10*time.Second))
			report(err)
			w.seat <- p
		}()
	}
	waitfor.Condition(t, 5*time.Second, "t1 and t2 wait in line", func() bool { return s.StandingBy(key) == 2 })
	if err := t0.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p1 := <-seat1
	if p1 == nil {
		t.FailNow()
	}
	if err := t1.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if got := woken.next(t); got != "t3" {
		t.Fatalf("let out %q in t1's place, want t3", got)
	}
	return p1, t2, seat2
}

// checkSeatMovedToT2 checks the store after t1's seat (p1) went to t2 (p2):
// t4 is let out in t2's place only as t2 settles, the store holds t2's
// seat alone, under its permit and label, and its fence is past t1's.
func checkSeatMovedToT2(t *testing.T, s *semaphore.Service, woken wakeLog, key string, p1 *semaphore.Permit, t2 *semaphore.Entry, p2 *semaphore.Permit) {
	t.Helper()
	ctx := context.Background()
	defer func() { _ = p2.Release(ctx) }()
	woken.none(t) // t4 comes as t2 starts, not before
	if err := t2.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if got := woken.next(t); got != "t4" {
		t.Fatalf("let out %q in t2's place, want t4", got)
	}
	hs, err := s.Holders(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || hs[0].PermitID != p2.ID() || hs[0].Label != "t2" {
		t.Fatalf("holders %+v, want only t2's %s", hs, p2.ID())
	}
	if p2.Fence() <= p1.Fence() {
		t.Fatalf("t2's fence %d is not past t1's %d", p2.Fence(), p1.Fence())
	}
}

// TestSeatedTokenFirstInAStaleLineIsPassedOver: a reply that named a
// token of this process first in line may be handed on after that token
// took its seat. The next seat given back passes it over and goes to the
// task standing by behind it, in memory, rather than through the store.
func TestSeatedTokenFirstInAStaleLineIsPassedOver(t *testing.T) {
	_, s, woken, key := wokenService(t)
	p1, t2, seat2 := standingPair(t, s, woken, key)
	s.NoteLine(key, "t1", "t2") // t1 holds its seat already
	p2 := releaseToT2InMemory(t, s, p1, seat2)
	checkSeatMovedToT2(t, s, woken, key, p1, t2, p2)
}

// releaseToT2InMemory releases t1's seat (p1) and returns t2's, which
// comes on seat2 (or the test fails once t2's wait timed out), checking
// that it was handed to t2 in memory.
func releaseToT2InMemory(t *testing.T, s *semaphore.Service, p1 *semaphore.Permit, seat2 <-chan *semaphore.Permit) *semaphore.Permit {
	t.Helper()
	if err := p1.Release(context.Background()); err != nil {
		t.Fatalf("t1's release: %v", err)
	}
	var p2 *semaphore.Permit
	select {
	case p2 = <-seat2:
	case <-time.After(5 * time.Second):
		t.Fatal("t2 got no seat within 5s of t1's release")
	}
	if p2 == nil {
		t.FailNow()
	}
	if n := s.TaskMoves(); n != 1 {
		t.Fatalf("%d seats handed to tasks in memory, want 1 (t2's)", n)
	}
	return p2
}
