package semaphore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// TestCapHoldsAcrossServices runs several Services, each on its own client,
// with dozens of goroutines each, and checks with an independent counter
// that no more than the capacity ever run at once, and that every seat can
// be held at once.
func TestCapHoldsAcrossServices(t *testing.T) {
	srv := redistest.Start(t)
	const capacity, perService, rounds = 5, 15, 12
	hold := 3 * time.Millisecond
	key := uniqueKey(t)
	var heldNs atomic.Int64
	services := []*semaphore.Service{newService(t, srv.Client()), newService(t, srv.Client()), newService(t, srv.Client())}
	start := time.Now()
	seats := cycles(t, services, perService, rounds, capacity, func(int) string { return key }, func() {
		t0 := time.Now()
		time.Sleep(hold)
		heldNs.Add(int64(time.Since(t0)))
	})
	elapsed := time.Since(start)
	if m := seats.peakOf(key); m > capacity {
		t.Fatalf("cap exceeded: %d ran at once, capacity %d", m, capacity)
	}
	// How busy the seats were depends on the machine's load; S3 measures
	// it. What must hold is that every seat can be taken at once.
	util := float64(heldNs.Load()) / (capacity * float64(elapsed))
	t.Logf("peak %d of %d, utilization %.3f over %s", seats.peakOf(key), capacity, util, elapsed)
	fillAllSeats(t, []*semaphore.Service{newService(t, srv.Client()), newService(t, srv.Client())}, key, capacity)
	s := newService(t, srv.Client())
	if n := used(t, s, key); n != 0 {
		t.Fatalf("%d seats still held after every release", n)
	}
}

func reasonOf(t *testing.T, err error) semaphore.Reason {
	t.Helper()
	var aerr *semaphore.AcquisitionError
	if !errors.As(err, &aerr) {
		t.Fatalf("want *AcquisitionError, got %T: %v", err, err)
	}
	return aerr.Reason
}

func TestAcquireReasons(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()

	t.Run("exhausted", func(t *testing.T) {
		s := newService(t, srv.Client())
		key := uniqueKey(t)
		mustAcquire(t, s, key, 1)
		_, err := s.Acquire(ctx, key, 1, semaphore.WithMaxAttempts(3))
		if r := reasonOf(t, err); r != semaphore.ReasonExhausted {
			t.Fatalf("reason %s, want exhausted: %v", r, err)
		}
		var aerr *semaphore.AcquisitionError
		errors.As(err, &aerr)
		if aerr.Attempts != 3 || aerr.Key != key {
			t.Fatalf("attempts %d key %q, want 3 and %q", aerr.Attempts, aerr.Key, key)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		s := newService(t, srv.Client())
		key := uniqueKey(t)
		mustAcquire(t, s, key, 1)
		start := time.Now()
		_, err := s.Acquire(ctx, key, 1, semaphore.WithWaitTimeout(150*time.Millisecond))
		if r := reasonOf(t, err); r != semaphore.ReasonTimeout {
			t.Fatalf("reason %s, want timeout: %v", r, err)
		}
		if time.Since(start) < 150*time.Millisecond {
			t.Fatalf("gave up before the wait budget: %s", time.Since(start))
		}
	})
	t.Run("canceled", func(t *testing.T) {
		s := newService(t, srv.Client())
		key := uniqueKey(t)
		mustAcquire(t, s, key, 1)
		cctx, cancel := context.WithCancel(ctx)
		go func() {
			defer cancel() // also when the waiter never queues: the Acquire must end
			if !waitfor.Eventually(5*time.Second, func() bool { return queued(t, srv.Client(), key) }) {
				t.Error("the waiter did not queue within 5s")
			}
		}()
		_, err := s.Acquire(cctx, key, 1)
		if r := reasonOf(t, err); r != semaphore.ReasonCanceled {
			t.Fatalf("reason %s, want canceled: %v", r, err)
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("errors.Is(err, context.Canceled) = false: %v", err)
		}
	})
	t.Run("shutdown", func(t *testing.T) {
		s := newService(t, srv.Client())
		key := uniqueKey(t)
		mustAcquire(t, s, key, 1)
		go func() {
			defer s.Close() // also when the waiter never queues: the Acquire must end
			if !waitfor.Eventually(5*time.Second, func() bool { return queued(t, srv.Client(), key) }) {
				t.Error("the waiter did not queue within 5s")
			}
		}()
		_, err := s.Acquire(ctx, key, 1)
		if r := reasonOf(t, err); r != semaphore.ReasonShutdown {
			t.Fatalf("reason %s, want shutdown: %v", r, err)
		}
		_, err = s.Acquire(ctx, key, 1)
		if r := reasonOf(t, err); r != semaphore.ReasonShutdown {
			t.Fatalf("after Close: reason %s, want shutdown", r)
		}
	})
	t.Run("error", func(t *testing.T) {
		own := redistest.Start(t)
		rdb := redis.NewClient(&redis.Options{Addr: own.Addr(), MaxRetries: 1, DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { _ = rdb.Close() })
		s := newService(t, rdb)
		key := uniqueKey(t)
		mustAcquire(t, s, key, 1)
		own.Stop()
		_, err := s.Acquire(ctx, key, 1)
		if r := reasonOf(t, err); r != semaphore.ReasonError {
			t.Fatalf("reason %s, want error: %v", r, err)
		}
		var aerr *semaphore.AcquisitionError
		errors.As(err, &aerr)
		if aerr.Err == nil {
			t.Fatal("reason error without the driver error")
		}
	})
	t.Run("error while waiting", func(t *testing.T) {
		own := redistest.Start(t)
		rdb := redis.NewClient(&redis.Options{Addr: own.Addr(), MaxRetries: 1, DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { _ = rdb.Close() })
		s := newService(t, rdb)
		key := uniqueKey(t)
		mustAcquire(t, s, key, 1)
		go func() {
			defer own.Stop() // also when the waiter never queues: the Acquire must end
			if !waitfor.Eventually(5*time.Second, func() bool { return queued(t, own.Client(), key) }) {
				t.Error("the waiter did not queue within 5s")
			}
		}()
		_, err := s.Acquire(ctx, key, 1, semaphore.WithWaitTimeout(20*time.Second))
		if r := reasonOf(t, err); r != semaphore.ReasonError {
			t.Fatalf("reason %s, want error: %v", r, err)
		}
	})
}

// queued reports whether some waiter stands in key's fleet-wide line.
func queued(t *testing.T, rdb *redis.Client, key string) bool {
	n, err := rdb.ZCard(context.Background(), semaphore.DefaultPrefix+"{"+key+"}:waiting").Result()
	return err == nil && n > 0
}

func TestTryAcquire(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	ctx := context.Background()
	var ps []*semaphore.Permit
	for i := range 3 {
		p, err := s.TryAcquire(ctx, key, 3)
		if err != nil || p == nil {
			t.Fatalf("try %d: permit %v, err %v", i, p, err)
		}
		ps = append(ps, p)
	}
	p, err := s.TryAcquire(ctx, key, 3)
	if p != nil || err != nil {
		t.Fatalf("full semaphore: want (nil, nil), got (%v, %v)", p, err)
	}
	if err := ps[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := s.TryAcquire(ctx, key, 3); p == nil || err != nil {
		t.Fatalf("after a release: want a permit, got (%v, %v)", p, err)
	}
}

func TestReleaseSemantics(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())

	t.Run("idempotent", func(t *testing.T) {
		key := uniqueKey(t)
		p := mustAcquire(t, s, key, 2)
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatalf("second release: %v", err)
		}
		if n := used(t, s, key); n != 0 {
			t.Fatalf("used %d after release", n)
		}
	})
	t.Run("expired seat is not held", func(t *testing.T) {
		key := uniqueKey(t)
		p := mustAcquire(t, s, key, 2, semaphore.WithTTL(50*time.Millisecond))
		waitfor.Condition(t, 5*time.Second, "lease lapses", func() bool {
			held, err := p.IsHeld(ctx)
			return err == nil && !held
		})
		if n := used(t, s, key); n != 0 {
			t.Fatalf("expired lease still counted: used %d", n)
		}
		if err := p.Release(ctx); !errors.Is(err, semaphore.ErrPermitNotHeld) {
			t.Fatalf("release of an expired seat: %v, want ErrPermitNotHeld", err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatalf("second release: %v, want nil", err)
		}
	})
	t.Run("extend", func(t *testing.T) {
		key := uniqueKey(t)
		p := mustAcquire(t, s, key, 2, semaphore.WithTTL(time.Second))
		before := p.ExpiresAt()
		if err := p.Extend(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if !p.ExpiresAt().After(before.Add(8*time.Second)) || p.TTL() != 10*time.Second {
			t.Fatalf("extend: expiry %s (was %s), ttl %s", p.ExpiresAt(), before, p.TTL())
		}
		if err := p.Extend(ctx, 0); err == nil {
			t.Fatal("Extend(0) accepted")
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.Extend(ctx, time.Second); !errors.Is(err, semaphore.ErrExtension) {
			t.Fatalf("extend after release: %v, want ErrExtension", err)
		}
	})
	t.Run("force release counts live holders only", func(t *testing.T) {
		key := uniqueKey(t)
		a := mustAcquire(t, s, key, 3)
		b := mustAcquire(t, s, key, 3)
		short := mustAcquire(t, s, key, 3, semaphore.WithTTL(30*time.Millisecond))
		waitfor.Condition(t, 5*time.Second, "short lease lapses", func() bool {
			held, err := short.IsHeld(ctx)
			return err == nil && !held
		})
		n, err := s.ForceReleaseAll(ctx, key)
		if err != nil || n != 2 {
			t.Fatalf("ForceReleaseAll = %d, %v; want 2 live holders displaced", n, err)
		}
		if err := a.Release(ctx); !errors.Is(err, semaphore.ErrPermitNotHeld) {
			t.Fatalf("release after force-release: %v", err)
		}
		if err := b.Extend(ctx, time.Second); !errors.Is(err, semaphore.ErrExtension) {
			t.Fatalf("extend after force-release: %v", err)
		}
	})
	t.Run("holders", func(t *testing.T) {
		key := uniqueKey(t)
		p1 := mustAcquire(t, s, key, 3, semaphore.WithHolder("task-1"), semaphore.WithTTL(20*time.Second))
		p2 := mustAcquire(t, s, key, 3, semaphore.WithHolder("task-2"), semaphore.WithTTL(10*time.Second))
		hs, err := s.Holders(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != 2 || hs[0].PermitID != p2.ID() || hs[0].Label != "task-2" || hs[1].Label != "task-1" || hs[1].PermitID != p1.ID() {
			t.Fatalf("holders %+v: want task-2 (soonest expiry) then task-1", hs)
		}
		if !hs[0].ExpiresAt.Equal(p2.ExpiresAt()) {
			t.Fatalf("holder expiry %s, permit says %s", hs[0].ExpiresAt, p2.ExpiresAt())
		}
		avail, err := s.AvailablePermits(ctx, key, 3)
		if err != nil || avail != 1 {
			t.Fatalf("available %d, %v; want 1", avail, err)
		}
		avail, err = s.AvailablePermits(ctx, key, 1)
		if err != nil || avail != 0 {
			t.Fatalf("available %d, %v; want 0 (never below)", avail, err)
		}
	})
}

func TestMixedTTLsShareAKey(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	long := mustAcquire(t, s, key, 2, semaphore.WithTTL(time.Minute))
	short := mustAcquire(t, s, key, 2, semaphore.WithTTL(40*time.Millisecond))
	waitfor.Condition(t, 5*time.Second, "short lease lapses", func() bool { return used(t, s, key) == 1 })
	if held, err := long.IsHeld(ctx); err != nil || !held {
		t.Fatalf("the long lease was evicted by the short one's expiry: held=%v err=%v", held, err)
	}
	if err := short.Release(ctx); !errors.Is(err, semaphore.ErrPermitNotHeld) {
		t.Fatalf("short: %v", err)
	}
	// A new short lease must not evict the long one either.
	again := mustAcquire(t, s, key, 2, semaphore.WithTTL(time.Second))
	if n := used(t, s, key); n != 2 {
		t.Fatalf("used %d, want 2", n)
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
	pttl := srv.Client().PTTL(ctx, semaphore.DefaultPrefix+"{"+key+"}:holders").Val()
	if pttl < 50*time.Second {
		t.Fatalf("holders key expires in %s, before the minute lease it holds", pttl)
	}
}

func TestIdleKeysExpire(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	p := mustAcquire(t, s, key, 1, semaphore.WithTTL(100*time.Millisecond), semaphore.WithHolder("x"))
	_, err := s.Acquire(ctx, key, 1, semaphore.WithMaxAttempts(2))
	if reasonOf(t, err) != semaphore.ReasonExhausted {
		t.Fatal(err)
	}
	_ = p
	waitfor.Condition(t, 10*time.Second, "every key of the semaphore expires", func() bool {
		keys, err := srv.Client().Keys(ctx, "*"+key+"*").Result()
		return err == nil && len(keys) == 0
	})
}

// TestLeaseFollowsServerClock moves the server's clock (miniredis) and not
// the caller's: the lease lapses by the server's time alone.
func TestLeaseFollowsServerClock(t *testing.T) {
	mr := miniredis.RunT(t)
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	mr.SetTime(base)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	s := newService(t, rdb)
	ctx := context.Background()
	key := uniqueKey(t)
	p := mustAcquire(t, s, key, 1, semaphore.WithTTL(10*time.Second))
	if !p.AcquiredAt().Equal(base) || !p.ExpiresAt().Equal(base.Add(10*time.Second)) {
		t.Fatalf("lease %s..%s, want server time %s + 10s", p.AcquiredAt(), p.ExpiresAt(), base)
	}
	if p, err := s.TryAcquire(ctx, key, 1); p != nil || err != nil {
		t.Fatalf("full: (%v, %v)", p, err)
	}
	mr.SetTime(base.Add(9 * time.Second))
	if n := used(t, s, key); n != 1 {
		t.Fatalf("used %d at 9s of a 10s lease", n)
	}
	mr.SetTime(base.Add(11 * time.Second))
	if n := used(t, s, key); n != 0 {
		t.Fatalf("used %d after the server passed the expiry", n)
	}
	q, err := s.TryAcquire(ctx, key, 1)
	if err != nil || q == nil {
		t.Fatalf("seat of a lapsed lease not free: (%v, %v)", q, err)
	}
	if err := p.Release(ctx); !errors.Is(err, semaphore.ErrPermitNotHeld) {
		t.Fatalf("release of lapsed lease: %v", err)
	}
}

func TestWithPermit(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	boom := errors.New("boom")
	err := s.WithPermit(ctx, key, 1, func(ctx context.Context) error {
		if n := used(t, s, key); n != 1 {
			t.Errorf("inside WithPermit: used %d", n)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("WithPermit returned %v, want fn's error", err)
	}
	if n := used(t, s, key); n != 0 {
		t.Fatalf("seat not released after fn failed: used %d", n)
	}
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Fatalf("panic not passed on: %v", r)
			}
		}()
		_ = s.WithPermit(ctx, key, 1, func(ctx context.Context) error { panic("kaboom") })
	}()
	if n := used(t, s, key); n != 0 {
		t.Fatalf("seat not released after fn panicked: used %d", n)
	}
	// A seat lost during the work is logged, not returned.
	err = s.WithPermit(ctx, key, 1, func(ctx context.Context) error {
		_, err := s.ForceReleaseAll(ctx, key)
		return err
	})
	if err != nil {
		t.Fatalf("WithPermit with a lost seat: %v, want nil (logged)", err)
	}
}

func TestAutoRenew(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	p := mustAcquire(t, s, key, 1, semaphore.WithTTL(150*time.Millisecond), semaphore.WithAutoRenew())
	if !p.IsAutoRenewing() {
		t.Fatal("not auto-renewing")
	}
	first := p.ExpiresAt()
	waitfor.Condition(t, 5*time.Second, "lease renewed twice past its first expiry", func() bool {
		return p.ExpiresAt().After(first.Add(100 * time.Millisecond))
	})
	if held, err := p.IsHeld(ctx); err != nil || !held {
		t.Fatalf("renewed seat not held: %v %v", held, err)
	}
	p.StopAutoRenew()
	if p.IsAutoRenewing() {
		t.Fatal("still auto-renewing after StopAutoRenew")
	}
	waitfor.Condition(t, 5*time.Second, "lease lapses once renewal stops", func() bool { return used(t, s, key) == 0 })

	// Lost() closes, and AfterLost runs its function, when renewal finds
	// the seat gone; a function stopped before does not run.
	q := mustAcquire(t, s, key, 2, semaphore.WithTTL(150*time.Millisecond), semaphore.WithAutoRenew())
	r := mustAcquire(t, s, key, 2, semaphore.WithTTL(150*time.Millisecond), semaphore.WithAutoRenew())
	ran := make(chan struct{})
	q.AfterLost(func() { close(ran) })
	var stoppedRan atomic.Bool
	if stop := r.AfterLost(func() { stoppedRan.Store(true) }); !stop() {
		t.Fatal("AfterLost's stop did not stop a function before the loss")
	}
	if _, err := s.ForceReleaseAll(ctx, key); err != nil {
		t.Fatal(err)
	}
	select {
	case <-q.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost() not closed after the seat was force-released")
	}
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("AfterLost's function did not run after the seat was lost")
	}
	select {
	case <-r.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost() of the second permit not closed after the force-release")
	}
	if stoppedRan.Load() {
		t.Fatal("a stopped AfterLost function ran")
	}
	late := make(chan struct{})
	if stop := q.AfterLost(func() { close(late) }); stop() {
		t.Fatal("stop reports stopping a function on a permit already lost")
	}
	select {
	case <-late:
	case <-time.After(5 * time.Second):
		t.Fatal("AfterLost on a lost permit did not run its function")
	}
	if q.IsAutoRenewing() {
		t.Fatal("renewal goes on after the seat was lost")
	}
	if err := q.Release(ctx); !errors.Is(err, semaphore.ErrPermitNotHeld) {
		t.Fatalf("release of a lost seat: %v", err)
	}
}

func TestLostWhenStoreUnreachable(t *testing.T) {
	own := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: own.Addr(), MaxRetries: 1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	s := newService(t, rdb)
	p := mustAcquire(t, s, uniqueKey(t), 1, semaphore.WithTTL(300*time.Millisecond), semaphore.WithAutoRenew())
	own.Stop()
	select {
	case <-p.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost() not closed though renewal could not reach the store past the lease")
	}
}

func TestCloseLeavesSeatsToLapse(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	other := newService(t, srv.Client())
	key := uniqueKey(t)
	p := mustAcquire(t, s, key, 1, semaphore.WithTTL(300*time.Millisecond), semaphore.WithAutoRenew())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if p.IsAutoRenewing() {
		t.Fatal("Close did not stop auto-renewal")
	}
	if n := used(t, other, key); n != 1 {
		t.Fatalf("Close released a held seat: used %d", n)
	}
	// Another process waits and gets the seat once the lease lapses.
	q, err := other.Acquire(ctx, key, 1, semaphore.WithWaitTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("seat of a closed Service never lapsed: %v", err)
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Work that finishes after Close still releases through its permit.
	r := mustAcquire(t, other, key, 1)
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatalf("release after Close: %v", err)
	}
	if n := used(t, newService(t, srv.Client()), key); n != 0 {
		t.Fatalf("used %d after release", n)
	}
}

func TestBadArguments(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client())
	ctx := context.Background()
	if _, err := semaphore.New(nil, semaphore.Options{}); err == nil {
		t.Error("New(nil) accepted")
	}
	if _, err := semaphore.New(srv.Client(), semaphore.Options{DefaultTTL: -time.Second}); err == nil {
		t.Error("negative DefaultTTL accepted")
	}
	cases := []struct {
		name string
		call func() error
	}{
		{"empty key", func() error { _, err := s.Acquire(ctx, "", 1); return err }},
		{"zero permits", func() error { _, err := s.Acquire(ctx, "k", 0); return err }},
		{"negative permits", func() error { _, err := s.TryAcquire(ctx, "k", -1); return err }},
		{"zero ttl", func() error { _, err := s.Acquire(ctx, "k", 1, semaphore.WithTTL(0)); return err }},
		{"negative ttl", func() error { _, err := s.TryAcquire(ctx, "k", 1, semaphore.WithTTL(-time.Second)); return err }},
		{"zero wait timeout", func() error { _, err := s.Acquire(ctx, "k", 1, semaphore.WithWaitTimeout(0)); return err }},
		{"zero attempts", func() error { _, err := s.Acquire(ctx, "k", 1, semaphore.WithMaxAttempts(0)); return err }},
		{"nil option", func() error { _, err := s.Acquire(ctx, "k", 1, nil); return err }},
		{"nil fn", func() error { return s.WithPermit(ctx, "k", 1, nil) }},
		{"used of empty key", func() error { _, err := s.UsedPermits(ctx, ""); return err }},
		{"available with 0 permits", func() error { _, err := s.AvailablePermits(ctx, "k", 0); return err }},
		{"force release empty key", func() error { _, err := s.ForceReleaseAll(ctx, ""); return err }},
		{"holders of empty key", func() error { _, err := s.Holders(ctx, ""); return err }},
	}
	for _, c := range cases {
		if err := c.call(); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	if n := used(t, s, "k"); n != 0 {
		t.Fatalf("a rejected call took a seat: used %d", n)
	}
}
