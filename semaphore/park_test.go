package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/redistest"
	"github.com/fleetcap/fleetcap/internal/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// TestParkAndWake: a token parks only while the semaphore is full, and the
// next release, by any Service, hands it to that Service's OnWake.
func TestParkAndWake(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	woken := make(chan string, 4)
	releaser := newService(t, srv.Client(), func(o *semaphore.Options) {
		o.OnWake = func(key, token string) { woken <- key + "/" + token }
	})
	parker := newService(t, srv.Client())
	key := uniqueKey(t)

	if parked, err := parker.Park(ctx, key, 1, "early", time.Minute); err != nil || parked {
		t.Fatalf("Park on a free semaphore = %v, %v; want false: take the seat instead", parked, err)
	}
	p := mustAcquire(t, releaser, key, 1)
	for _, token := range []string{"first", "second"} {
		if parked, err := parker.Park(ctx, key, 1, token, time.Minute); err != nil || !parked {
			t.Fatalf("Park %s on a full semaphore = %v, %v", token, parked, err)
		}
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-woken:
		if got != key+"/first" {
			t.Fatalf("woke %q, want the first token", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no token handed to OnWake after a release")
	}
	if token, err := parker.Unpark(ctx, key); err != nil || token != "second" {
		t.Fatalf("Unpark = %q, %v; want second", token, err)
	}
	if token, err := parker.Unpark(ctx, key); err != nil || token != "" {
		t.Fatalf("Unpark of an empty line = %q, %v", token, err)
	}
	if _, err := parker.Park(ctx, key, 1, "", time.Minute); err == nil {
		t.Fatal("Park with an empty token accepted")
	}
}

// TestHandOverWakesParked: a seat handed to a local waiter is a release
// too: it wakes a parked token, to refill the waiters.
func TestHandOverWakesParked(t *testing.T) {
	s, woken := newWakingService(t)
	ctx := context.Background()
	key := uniqueKey(t)
	p := mustAcquire(t, s, key, 1)
	got := acquireInLine(t, s, key)
	if parked, err := s.Park(ctx, key, 1, "parked", time.Minute); err != nil || !parked {
		t.Fatalf("Park = %v, %v", parked, err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q := <-got
	select {
	case token := <-woken:
		if token != "parked" {
			t.Fatalf("woke %q", token)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("hand-over did not wake the parked token")
	}
	if q != nil {
		_ = q.Release(ctx)
	}
}

// TestForceReleaseWakesParked: a force-release hands on a parked token for
// every seat it frees, so parked work does not wait for its retry delay.
func TestForceReleaseWakesParked(t *testing.T) {
	s, woken := newWakingService(t)
	ctx := context.Background()
	key := uniqueKey(t)
	mustAcquire(t, s, key, 2)
	mustAcquire(t, s, key, 2)
	for _, token := range []string{"first", "second", "third"} {
		if parked, err := s.Park(ctx, key, 2, token, time.Minute); err != nil || !parked {
			t.Fatalf("Park %s = %v, %v", token, parked, err)
		}
	}
	if n, err := s.ForceReleaseAll(ctx, key); err != nil || n != 2 {
		t.Fatalf("ForceReleaseAll = %d, %v; want 2", n, err)
	}
	got := map[string]bool{}
	for range 2 {
		select {
		case token := <-woken:
			got[token] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("woke %v after the force-release; want first and second", got)
		}
	}
	if !got["first"] || !got["second"] {
		t.Fatalf("woke %v; want first and second", got)
	}
	if token, err := s.Unpark(ctx, key); err != nil || token != "third" {
		t.Fatalf("Unpark = %q, %v; want third still parked", token, err)
	}
}

// newWakingService is a Service on a redis-server of its own whose OnWake
// sends the tokens it is handed to woken.
func newWakingService(t *testing.T) (s *semaphore.Service, woken chan string) {
	woken = make(chan string, 4)
	s = newService(t, redistest.Start(t).Client(), func(o *semaphore.Options) {
		o.OnWake = func(key, token string) { woken <- token }
	})
	return s, woken
}

// TestATokenParksOnce: a task that goes back and parks again while the key
// stays contended keeps one token and its first place, and a task that
// takes a seat with WithUnpark leaves no token behind, whether it takes the
// seat itself or has it handed over by a local release. (Every park used to
// add a token: the parked line grew without bound.)
func TestATokenParksOnce(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	parkedKey := semaphore.DefaultPrefix + "{" + key + "}:parked"
	holder := mustAcquire(t, s, key, 1)
	for _, token := range []string{"a", "b", "a", "b", "c", "a"} {
		if parked, err := s.Park(ctx, key, 1, token, time.Minute); err != nil || !parked {
			t.Fatalf("Park %s = %v, %v", token, parked, err)
		}
	}
	if n := srv.Client().ZCard(ctx, parkedKey).Val(); n != 3 {
		t.Fatalf("%d tokens parked for 3 tasks", n)
	}
	// b's task takes a seat by a local hand-over, c's its own way.
	got := acquireInLine(t, s, key, semaphore.WithUnpark("b"))
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q := <-got
	if q == nil {
		t.FailNow()
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// (The emptied local line leaves the fleet-wide line a moment later.)
	waitfor.Condition(t, 2*time.Second, "c's task takes the free seat", func() bool {
		r, err := s.TryAcquire(ctx, key, 1, semaphore.WithUnpark("c"))
		return err == nil && r != nil
	})
	left, err := srv.Client().ZRange(ctx, parkedKey, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != "a" {
		t.Fatalf("parked after b and c took seats: %q, want [a]", left)
	}
}
