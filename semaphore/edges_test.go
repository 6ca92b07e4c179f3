package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/tcpproxy"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// The edge cases an audit found (issue 12): each test failed before its fix.

// TestDepartingWaiterWakesTheNext: a waiter first in the fleet-wide line
// that gives up (here: it used its attempts) while the other seats are held
// leaves the line at once, and so a seat freed next goes to the waiter
// behind it without delay, whatever the capacity. (Its entry used to stay
// until its next backoff, and leaving counted free seats as if the
// capacity were 1: the next waiter slept out its backoff.)
func TestDepartingWaiterWakesTheNext(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const capacity = 2
	const bound = 80 * time.Millisecond // a wake takes about a millisecond
	holders := newService(t, srv.Client())
	first, second := newService(t, srv.Client()), newService(t, srv.Client())
	key := uniqueKey(t)
	mustAcquire(t, holders, key, capacity)
	held := mustAcquire(t, holders, key, capacity)

	gaveUp := make(chan error, 1)
	go func() {
		_, err := first.Acquire(ctx, key, capacity, semaphore.WithMaxAttempts(7))
		gaveUp <- err
	}()
	waitfor.Condition(t, 5*time.Second, "first waiter in line", func() bool { return first.LocalWaiters(key) == 1 })
	serverClockPasses(t, srv.Client(), 5*time.Millisecond)
	got := make(chan *semaphore.Permit, 1)
	go func() {
		p, err := second.Acquire(ctx, key, capacity, semaphore.WithWaitTimeout(20*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitfor.Condition(t, 5*time.Second, "second waiter in line", func() bool { return second.LocalWaiters(key) == 1 })
	select {
	case err := <-gaveUp:
		if r := reasonOf(t, err); r != semaphore.ReasonExhausted {
			t.Fatalf("first waiter: %s, want exhausted", r)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the first waiter never used up its attempts")
	}
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		lag := time.Since(released)
		if p == nil {
			t.FailNow()
		}
		defer p.Release(ctx)
		if lag > bound {
			t.Fatalf("the second waiter took the freed seat %s after its release", lag)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second waiter never took the freed seat")
	}
}

// proxied returns a client of srv through a TCP proxy (for connections
// made slow on purpose), with warm connections in its pools: conns commands
// ran at once on it, and conns pipelines (go-redis keeps the connections
// of pipelines in a pool of their own, which the plain give and the
// auto-pipeliner's batches use).
func proxied(t *testing.T, srv *redistest.Server, conns int) (*redis.Client, *tcpproxy.Proxy) {
	t.Helper()
	proxy, err := tcpproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), PoolSize: conns + 4, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each holds its connection for a moment, so that they are
			// all made.
			if err := rdb.BLPop(context.Background(), 50*time.Millisecond, "warm-"+t.Name()).Err(); err != nil && !errors.Is(err, redis.Nil) {
				t.Error(err)
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipe := rdb.Pipeline()
			pipe.BLPop(context.Background(), 50*time.Millisecond, "warm-"+t.Name())
			if _, err := pipe.Exec(context.Background()); err != nil && !errors.Is(err, redis.Nil) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	return rdb, proxy
}

// TestSlowSubscriptionBlocksNobody: while a Service subscribes to its wake
// messages over a connection that takes seconds to open, its other permits
// go on: a lost seat is noticed (Lost closes), and Release and
// StopAutoRenew return. (The subscription used to be made under the
// Service-wide lock.)
func TestSlowSubscriptionBlocksNobody(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	rdb, proxy := proxied(t, srv, 6)
	s := newService(t, rdb)
	other := newService(t, srv.Client())
	full, lost, idle := uniqueKey(t), uniqueKey(t), uniqueKey(t)
	mustAcquire(t, other, full, 1)
	doomed := mustAcquire(t, s, lost, 1, semaphore.WithTTL(300*time.Millisecond), semaphore.WithAutoRenew())
	kept := mustAcquire(t, s, idle, 1, semaphore.WithTTL(time.Minute), semaphore.WithAutoRenew())

	const slow = 2 * time.Second
	proxy.SetDialDelay(slow)
	accepted := proxy.Accepted()
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		_, _ = s.Acquire(waitCtx, full, 1) // its line subscribes, slowly
	}()
	defer func() { stopWaiting(); <-waited }()
	waitfor.Condition(t, 5*time.Second, "the subscription's connection is on its way", func() bool { return proxy.Accepted() > accepted })

	if _, err := other.ForceReleaseAll(ctx, lost); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	select {
	case <-doomed.Lost():
		if lag := time.Since(freed); lag > slow/2 {
			t.Fatalf("Lost closed %s after the seat was force-released", lag)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lost never closed")
	}
	start := time.Now()
	kept.StopAutoRenew()
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > slow/2 {
		t.Fatalf("StopAutoRenew and Release took %s during the subscription", took)
	}
}

// TestGivingUpLeavesNoEntry: an Acquire that gives up (timeout, cancel,
// Close) before its line's goroutine made an attempt takes its entry out
// of the fleet-wide line: a newcomer then finds the freed seat at once.
// (The entry used to stay until it lapsed, 3 s later, and TryAcquire on a
// free semaphore returned nothing meanwhile.) New connections are slow to
// open, as in the audit's reproduction.
func TestGivingUpLeavesNoEntry(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	giveUps := map[string]func(t *testing.T, s *semaphore.Service, key string) error{
		"timeout": func(_ *testing.T, s *semaphore.Service, key string) error {
			_, err := s.Acquire(ctx, key, 1, semaphore.WithWaitTimeout(50*time.Millisecond))
			return err
		},
		"cancel": func(t *testing.T, s *semaphore.Service, key string) error {
			cctx, cancel := context.WithCancel(ctx)
			go func() {
				defer cancel() // Acquire returns after this goroutine is done with t
				if !waitfor.Eventually(5*time.Second, func() bool { return s.LocalWaiters(key) == 1 }) {
					t.Error("the Acquire never waited in its line")
				}
			}()
			_, err := s.Acquire(cctx, key, 1)
			return err
		},
		"close": func(t *testing.T, s *semaphore.Service, key string) error {
			go func() {
				defer s.Close() // Acquire returns after this goroutine is done with t
				if !waitfor.Eventually(5*time.Second, func() bool { return s.LocalWaiters(key) == 1 }) {
					t.Error("the Acquire never waited in its line")
				}
			}()
			_, err := s.Acquire(ctx, key, 1)
			return err
		},
	}
	for name, giveUp := range giveUps {
		t.Run(name, func(t *testing.T) {
			rdb, proxy := proxied(t, srv, 4)
			s := newService(t, rdb)
			other := newService(t, srv.Client())
			key := uniqueKey(t)
			holder := mustAcquire(t, other, key, 1)
			proxy.SetDialDelay(time.Second)
			if err := giveUp(t, s, key); err == nil {
				t.Fatal("the Acquire took a seat of a full semaphore")
			}
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			var p *semaphore.Permit
			waitfor.Condition(t, 2*time.Second, "a newcomer takes the free seat", func() bool {
				var err error
				p, err = other.TryAcquire(ctx, key, 1)
				return err == nil && p != nil
			})
			_ = p.Release(ctx)
		})
	}
}

// TestSeatWonDuringCloseIsGivenBack: a seat an Acquire wins on the wire
// while the Service closes is given back, and the Acquire fails with
// ReasonShutdown. (The caller used to get it, not renewed.)
func TestSeatWonDuringCloseIsGivenBack(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	proxy, err := tcpproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	proxy.SetDialDelay(300 * time.Millisecond) // the first call waits for its connection
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	s := newService(t, rdb)
	key := uniqueKey(t)
	type result struct {
		p   *semaphore.Permit
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := s.Acquire(ctx, key, 1, semaphore.WithAutoRenew())
		done <- result{p, err}
	}()
	waitfor.Condition(t, 5*time.Second, "the Acquire's call is on its way", func() bool { return proxy.Accepted() > 0 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return after Close")
	}
	if r.p != nil {
		_ = r.p.Release(ctx)
		t.Fatalf("Acquire handed out a seat won during Close (auto-renewing: %v)", r.p.IsAutoRenewing())
	}
	if reason := reasonOf(t, r.err); reason != semaphore.ReasonShutdown {
		t.Fatalf("reason %s, want shutdown", reason)
	}
	watcher := newService(t, srv.Client())
	waitfor.Condition(t, 5*time.Second, "the seat is given back", func() bool { return used(t, watcher, key) == 0 })
}

// TestSubMillisecondTTL: leases are kept in whole milliseconds, so a TTL
// under one is a bad argument everywhere a TTL is given. (It used to
// become a 0 ms lease that admitted every caller.)
func TestSubMillisecondTTL(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	if _, err := semaphore.New(srv.Client(), semaphore.Options{DefaultTTL: 500 * time.Microsecond}); err == nil {
		t.Error("New accepted a DefaultTTL of 500µs")
	}
	if p, err := s.TryAcquire(ctx, key, 1, semaphore.WithTTL(999*time.Microsecond)); err == nil {
		t.Errorf("TryAcquire accepted a TTL of 999µs (permit %v)", p)
	}
	if _, err := s.Acquire(ctx, key, 1, semaphore.WithTTL(time.Nanosecond)); err == nil {
		t.Error("Acquire accepted a TTL of 1ns")
	}
	p := mustAcquire(t, s, key, 1, semaphore.WithTTL(time.Millisecond+time.Microsecond))
	if err := p.Extend(ctx, 500*time.Microsecond); err == nil {
		t.Error("Extend accepted a TTL of 500µs")
	}
}

// TestAnyKeyOnACluster: keys with braces and percent signs work on a Redis
// Cluster (every key of a semaphore stays in one slot), and two keys never
// share seats. ("}acme" used to make the keys of one semaphore land in
// different slots: every call failed with CROSSSLOT.)
func TestAnyKeyOnACluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	ctx := context.Background()
	a, b := newService(t, cluster.Client(t)), newService(t, cluster.Client(t))
	keys := []string{"}acme", "}", "{", "{}", "a}b{c", "tenant:{acme}", "100%", "%7D", "%", "%25"}
	for _, key := range keys {
		p, err := a.Acquire(ctx, key, 1, semaphore.WithHolder("h"), semaphore.WithWaitTimeout(5*time.Second))
		if err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
		if q, err := b.TryAcquire(ctx, key, 1); q != nil || err != nil {
			t.Fatalf("key %q: a second seat of capacity 1: (%v, %v)", key, q, err)
		}
		if hs, err := b.Holders(ctx, key); err != nil || len(hs) != 1 || hs[0].Label != "h" {
			t.Fatalf("key %q: holders %+v, %v", key, hs, err)
		}
		got := acquireInLine(t, b, key)
		if err := p.Release(ctx); err != nil {
			t.Fatalf("key %q: release: %v", key, err)
		}
		select {
		case q := <-got:
			if q == nil {
				t.FailNow()
			}
			if err := q.Release(ctx); err != nil {
				t.Fatalf("key %q: %v", key, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("key %q: the waiter never got the released seat", key)
		}
		if _, err := b.ForceReleaseAll(ctx, key); err != nil {
			t.Fatalf("key %q: force release: %v", key, err)
		}
	}
	// Each key is its own semaphore: a seat of every key at once.
	for _, key := range keys {
		if p, err := a.TryAcquire(ctx, key, 1); p == nil || err != nil {
			t.Fatalf("key %q shares its seat with another key: (%v, %v)", key, p, err)
		}
	}
}

// TestLeavingWaitersLeaveNoRoomKeys: Acquire calls that give up on a full
// semaphore, on a plain and a fair key, take every trace of their tokens
// with them: the waiting, the slots entries, the room's settings and a
// fair key's notes are gone, while the seat's holder still holds.
func TestLeavingWaitersLeaveNoRoomKeys(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for _, fair := range []bool{false, true} {
		s := newService(t, srv.Client())
		key := uniqueKey(t)
		holder := mustAcquire(t, s, key, 1, semaphore.WithTTL(time.Minute))
		var wg sync.WaitGroup
		errs := make(chan error, 3)
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				opts := []semaphore.AcquireOption{semaphore.WithWaitTimeout(200 * time.Millisecond)}
				if fair {
					opts = append(opts, semaphore.WithShare(fmt.Sprintf("tenant-%d", i), 1))
				}
				_, err := s.Acquire(ctx, key, 1, opts...)
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if reasonOf(t, err) != semaphore.ReasonTimeout {
				t.Fatalf("fair %v: a waiter on a full semaphore: %v, want a timeout", fair, err)
			}
		}
		for _, suffix := range []string{"waiting", "slots", "room", "shares", "reals"} {
			k := storeKey(key, suffix)
			if n, err := srv.Client().Exists(ctx, k).Result(); err != nil || n != 0 {
				t.Errorf("fair %v: %s left behind (%d, %v)", fair, k, n, err)
			}
		}
		if n, err := s.UsedPermits(ctx, key); err != nil || n != 1 {
			t.Errorf("fair %v: %d seats used, %v: want the holder's", fair, n, err)
		}
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSeatSentWhileCutOffArrives: a seat given to a waiter while its
// process is cut off from Redis (the message naming it is published to
// nobody) reaches the waiter once the process is back: its recheck finds
// the waiter out of the line with the seat held for it, and hands it on.
func TestSeatSentWhileCutOffArrives(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	rdb, proxy := proxied(t, srv, 0)
	key := uniqueKey(t)
	holder := mustAcquire(t, newService(t, srv.Client()), key, 1, semaphore.WithTTL(time.Minute))
	got := acquireInLine(t, newService(t, rdb), key)
	waitfor.Condition(t, 5*time.Second, "the waiter is in the line on the server", func() bool {
		n, err := srv.Client().ZCard(ctx, storeKey(key, "waiting")).Result()
		return err == nil && n == 1
	})
	proxy.Cut()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	watcher := newService(t, srv.Client())
	if n := used(t, watcher, key); n != 1 {
		t.Fatalf("%d seats held after the release, want the one given to the waiter", n)
	}
	proxy.Restore()
	select {
	case p := <-got:
		if p == nil {
			t.Fatal("the waiter got no seat")
		}
		if p.Fence() == 0 {
			t.Fatal("the seat handed on carries no fence")
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the seat given while the waiter's process was cut off never reached it")
	}
}
