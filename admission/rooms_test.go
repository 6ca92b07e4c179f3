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
	if _, err := sem.Admit(ctx, "c", 1, other); err != nil {
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
