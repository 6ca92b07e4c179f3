package semaphore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// grantOrder holds key's one seat while waiters join in the order of
// values (value:weight names), one at a time, then passes the seat on
// release by release, and returns the values in the order they were
// served.
func grantOrder(t *testing.T, waiters []string) []string {
	t.Helper()
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	held := mustAcquire(t, s, key, 1)
	type seat struct {
		value string
		p     *semaphore.Permit
	}
	seats := make(chan seat, len(waiters))
	for i, w := range waiters {
		var value string
		var weight int
		if _, err := fmt.Sscanf(strings.Replace(w, ":", " ", 1), "%s %d", &value, &weight); err != nil {
			t.Fatal(err)
		}
		go func() {
			p, err := s.Acquire(ctx, key, 1, semaphore.WithShare(value, weight), semaphore.WithWaitTimeout(30*time.Second))
			if err != nil {
				t.Error(value, err)
			}
			seats <- seat{value, p}
		}()
		waitfor.Condition(t, 5*time.Second, "the waiter in line", func() bool { return s.LocalWaiters(key) == i+1 })
	}
	st, err := s.RoomStats(ctx, key)
	if err != nil || st.Waiting != len(waiters) || len(st.TopValues) == 0 || st.OldestWait <= 0 {
		t.Fatalf("room stats %+v (%v): want %d waiting, the values with the most, and an oldest wait", st, err, len(waiters))
	}
	var order []string
	for range waiters {
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		next := <-seats
		if next.p == nil {
			t.FailNow()
		}
		order = append(order, next.value)
		held = next.p
	}
	_ = held.Release(ctx)
	return order
}

// TestSharesTakeTurns: three small values that join behind a backlog of 20
// of one value are served within the first turns, not after the backlog.
func TestSharesTakeTurns(t *testing.T) {
	var waiters []string
	for range 20 {
		waiters = append(waiters, "big:1")
	}
	for _, v := range []string{"s1", "s2", "s3"} {
		waiters = append(waiters, v+":1", v+":1")
	}
	order := grantOrder(t, waiters)
	last := 0
	for i, v := range order {
		if v != "big" {
			last = i + 1
		}
	}
	t.Logf("served: %v", order)
	if last > 10 {
		t.Fatalf("the last small value's waiter was served %dth of %d, want within the first 10: %v", last, len(order), order)
	}
}

// TestShareWeights: of two values that both wait, one of weight 3 gets
// three seats for every one of the other's.
func TestShareWeights(t *testing.T) {
	var waiters []string
	for range 24 {
		waiters = append(waiters, "heavy:3", "light:1")
	}
	order := grantOrder(t, waiters)
	heavy := 0
	for _, v := range order[:24] {
		if v == "heavy" {
			heavy++
		}
	}
	share := float64(heavy) / 24
	t.Logf("heavy share of the first 24 seats: %.3f", share)
	if share < 0.65 || share > 0.85 {
		t.Fatalf("heavy got %.3f of the seats while both waited, want 0.75 +- 0.1: %v", share, order[:24])
	}
}

// TestWithShareBadArguments: an empty value and a weight below 1 are bad
// arguments.
func TestWithShareBadArguments(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client())
	for _, opt := range []semaphore.AcquireOption{semaphore.WithShare("", 1), semaphore.WithShare("a", 0)} {
		if _, err := s.TryAcquire(context.Background(), "k", 1, opt); err == nil {
			t.Error("accepted")
		}
	}
}
