package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// TestSweepAfterResizeIsNotSkipped: a worker's sweep skips a room another
// process swept within the interval (semaphore.Room.Audit), but the sweep
// an override's new capacity sets off (resized) sweeps it at once.
func TestSweepAfterResizeIsNotSkipped(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	woken := make(chan string, 16)
	a := newAdmitter(t, rdb, "tasks: {job: {semaphore: {key: c, capacity: 1}}}\n", semaphore.Options{OnWake: func(_ string, tokens []string) {
		for _, tok := range tokens {
			woken <- tok
		}
	}})
	sem := a.Semaphore
	l := Limit{Spec: a.Table.Plain(KindCap)["c"], Key: "c"}.Resized(nil)
	room := a.room(&l)
	if e, err := sem.Enter(ctx, "c", 1, "holder", room); err != nil || e.Permit == nil {
		t.Fatalf("the first task takes no seat: %v", err)
	}
	if ok, err := sem.Reserve(ctx, "c", 1, "t1", room); err != nil || !ok {
		t.Fatalf("Reserve with a place free = %v, %v", ok, err)
	}
	if _, err := sem.Park(ctx, "c", 1, "t2", room); err != nil {
		t.Fatal(err)
	}
	// Another process swept the room, for as long as this test runs.
	other := room
	other.Audit = time.Hour
	if _, _, err := sem.Admit(ctx, "c", 1, other); err != nil {
		t.Fatal(err)
	}
	lapsed := func() bool {
		t.Helper()
		places, err := rdb.ZRangeWithScores(ctx, "fleetcap:sem:{c}:places", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range places {
			if strings.HasPrefix(p.Member.(string), "t1\t") {
				return p.Score <= float64(now.UnixMilli())
			}
		}
		return false
	}
	// t1's task never comes: its place lapses after the room's Transit.
	waitfor.Condition(t, 5*time.Second, "t1's place lapses", lapsed)
	a.Sweep(ctx, false)
	if !lapsed() {
		t.Fatal("a sweep within another process's interval swept the room")
	}
	a.Sweep(ctx, true)
	select {
	case tok := <-woken:
		if tok != "t1" {
			t.Fatalf("the sweep after a resize let out %q, want t1, whose place lapsed", tok)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the sweep after a resize let nobody out")
	}
}

// TestSweepLeavesARoomAnotherProcessSweeps: a worker whose sweep finds a
// room swept by another process leaves it to that one for its next sweeps,
// while the sweeper keeps sweeping it; once the sweeper stops, the other
// takes the room over within leaveSwept.
func TestSweepLeavesARoomAnotherProcessSweeps(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	const yaml = "tasks: {job: {semaphore: {key: c, capacity: 1}}}\n"
	sweeper := newAdmitter(t, rdb, yaml, semaphore.Options{OnWake: func(string, []string) {}})
	other := newAdmitter(t, rdb, yaml, semaphore.Options{OnWake: func(string, []string) {}})
	l := Limit{Spec: sweeper.Table.Plain(KindCap)["c"], Key: "c"}.Resized(nil)
	room := sweeper.room(&l)
	if e, err := sweeper.Semaphore.Enter(ctx, "c", 1, "holder", room); err != nil || e.Permit == nil {
		t.Fatalf("the first task takes no seat: %v", err)
	}
	if _, err := sweeper.Semaphore.Park(ctx, "c", 1, "parked", room); err != nil {
		t.Fatal(err)
	}
	const roomKey = "fleetcap:sem:{c}:room"
	swept := func() bool {
		t.Helper()
		n, err := rdb.HExists(ctx, roomKey, "sweptat").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	sweeper.Sweep(ctx, false)
	if !swept() {
		t.Fatal("the first sweep did not mark the room swept")
	}
	marked := time.Now()
	other.Sweep(ctx, false) // finds it swept by the sweeper
	// The sweeper's mark runs out (as if it had stopped sweeping).
	if err := rdb.HDel(ctx, roomKey, "sweptat").Err(); err != nil {
		t.Fatal(err)
	}
	other.Sweep(ctx, false)
	if swept() {
		t.Fatal("a process that found the room swept by another swept it at its next sweep")
	}
	sweeper.Sweep(ctx, false)
	if !swept() {
		t.Fatal("the sweeper left its room alone")
	}

	// The sweeper stops; the other process sweeps as its worker would,
	// and takes the room over once its mark of the sweeper's call runs
	// out.
	if err := rdb.HDel(ctx, roomKey, "sweptat").Err(); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, leaveSwept+2*time.Second, "the other process takes the sweep over", func() bool {
		other.Sweep(ctx, false)
		return swept()
	})
	// Timed from before the call that marked the room, so that a slow
	// machine cannot make it look early.
	if took := time.Since(marked); took < leaveSwept {
		t.Fatalf("the other process swept %s after it found the room swept by another, want no sooner than %s", took, leaveSwept)
	}
}
