package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// roomStats reads key's room, failing the test on an error.
func roomStats(t *testing.T, s *semaphore.Service, key string) semaphore.RoomStats {
	t.Helper()
	st, err := s.RoomStats(context.Background(), key)
	if err != nil {
		t.Fatalf("RoomStats %s: %v", key, err)
	}
	return st
}

// TestRoomStats: RoomStats counts the tasks parked and standing by for a
// key and finds the oldest arrival among both (a standby token that came
// first, then the first parked once it leaves), in server time; a place
// that lapsed no longer counts as in use but its task still waits; the
// reading changes nothing; a key nobody waits for reads as zero.
func TestRoomStats(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client())
	ctx := context.Background()
	base := uniqueKey(t)
	key := base + "}odd{" // a key whose hash tag needs escaping
	room := roomOf(1)

	if st := roomStats(t, s, key); st.Waiting != 0 || st.Parked != 0 || st.Standby != 0 || !st.OldestArrival.IsZero() || st.OldestWait != 0 || st.ReadAt.IsZero() {
		t.Fatalf("empty room: %+v", st)
	}
	holder := enter(t, s, key, 1, "holder", room)
	if holder.Permit == nil {
		t.Fatal("no seat for the first task")
	}
	if st := roomStats(t, s, key); st.Waiting != 0 || st.Standby != 0 {
		t.Fatalf("a task holding its seat counts as waiting: %+v", st)
	}
	// a stands by with a short place; b and c are parked after it.
	short := room
	short.Hold = 300 * time.Millisecond
	a := enter(t, s, key, 1, "a", short)
	if !a.Standby {
		t.Fatal("a has no standby place")
	}
	before := serverTime(t, srv)
	for _, token := range []string{"b", "c"} {
		if e := enter(t, s, key, 1, token, room); e.Standby || e.Permit != nil {
			t.Fatalf("%s: want the room", token)
		}
	}
	st := roomStats(t, s, key)
	if st.Waiting != 3 || st.Parked != 2 || st.Standby != 1 {
		t.Fatalf("a standing by, b and c parked: %+v, want 3 waiting, 2 parked, 1 standby", st)
	}
	if !st.OldestArrival.Before(before) {
		t.Errorf("oldest arrival %v is not a's (before %v, when b and c came)", st.OldestArrival, before)
	}
	if got := st.ReadAt.Sub(st.OldestArrival); st.OldestWait != got || got <= 0 {
		t.Errorf("oldest wait %v, want read time minus arrival %v (> 0)", st.OldestWait, got)
	}
	if after := serverTime(t, srv); st.ReadAt.Before(before) || st.ReadAt.After(after) {
		t.Errorf("read at %v, not within the server's %v..%v", st.ReadAt, before, after)
	}
	first := st

	// a's place lapses: no longer in use, but a still waits (it goes back
	// among the parked, first, at the next admission); the reading does
	// not move it.
	waitfor.Condition(t, 10*time.Second, "a's standby place lapses", func() bool { return roomStats(t, s, key).Standby == 0 })
	st = roomStats(t, s, key)
	if st.Waiting != 3 || st.Parked != 2 || !st.OldestArrival.Equal(first.OldestArrival) || st.OldestWait <= first.OldestWait {
		t.Fatalf("after a's place lapsed: %+v, want 3 waiting, 2 parked, the same oldest arrival %v waited longer than %v",
			st, first.OldestArrival, first.OldestWait)
	}
	standbyKey := semaphore.DefaultPrefix + "{" + base + "%7Dodd{}:places"
	if n := srv.Client().ZCard(ctx, standbyKey).Val(); n != 1 {
		t.Fatalf("RoomStats moved the lapsed place (%d left in %s)", n, standbyKey)
	}

	// a gives up: b, parked first, is the oldest now.
	if err := s.Dismiss(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	st = roomStats(t, s, key)
	if st.Waiting != 2 || st.Parked != 2 || st.Standby != 0 || !st.OldestArrival.After(first.OldestArrival) || st.OldestArrival.Before(before) {
		t.Fatalf("after a left: %+v, want b and c waiting, b's arrival (after %v) the oldest", st, before)
	}
	if _, err := s.RoomStats(ctx, ""); err == nil {
		t.Error("RoomStats of an empty key: no error")
	}
}

// serverTime is the Redis server's clock.
func serverTime(t *testing.T, srv *redistest.Server) time.Time {
	t.Helper()
	now, err := srv.Client().Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}
