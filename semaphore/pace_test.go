package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/semaphore"
)

// TestPacedRoomKeepsApartFromTheSemaphoresRoom: a key's paced room and its
// semaphore's room hold the same token apart, under names of their own in
// the key's hash tag: handing the token out of the paced room leaves it
// parked in the semaphore's, and the paced room hands out one token a gap,
// oldest first, then says it is empty.
func TestPacedRoomKeepsApartFromTheSemaphoresRoom(t *testing.T) {
	srv := redistest.Start(t)
	rdb, ctx := srv.Client(), context.Background()
	sem := newService(t, rdb)
	rooms := sem.PacedRooms(false)
	room := semaphore.Room{Hold: time.Minute, Transit: time.Minute, TTL: time.Minute}
	if _, err := sem.Park(ctx, "k", 1, "t", room); err != nil {
		t.Fatal(err)
	}
	for i, token := range []string{"t", "u"} {
		if n, err := rooms.Park(ctx, "k", token, time.Minute, true); err != nil || n != i+1 {
			t.Fatalf("park %q in the paced room = %d, %v, want %d", token, n, err, i+1)
		}
	}
	for _, name := range rdb.Keys(ctx, "*").Val() {
		if !strings.HasPrefix(name, semaphore.DefaultPrefix+"{k}:") && !strings.HasPrefix(name, semaphore.DefaultPrefix+"paced:{k}:") {
			t.Errorf("a Redis key %q of neither room", name)
		}
	}
	gap := time.Hour
	h, wait, err := rooms.Pop(ctx, "k", gap)
	// The first hand-out is spaced from now less half a gap.
	if err != nil || h.Token != "t" || h.Arrival <= 0 || wait < gap/2-time.Second || wait > gap/2 {
		t.Fatalf("Pop = %+v, %s, %v, want t with its arrival, and the next in half a gap", h, wait, err)
	}
	if h, wait, err := rooms.Pop(ctx, "k", gap); err != nil || h.Token != "" || wait < gap/2-time.Second {
		t.Fatalf("Pop within the gap = %+v, %s, %v, want nothing for half a gap", h, wait, err)
	}
	if stats, err := sem.RoomStats(ctx, "k"); err != nil || stats.Parked != 1 {
		t.Fatalf("the semaphore's room after the paced room's hand-out: %+v, %v, want t still parked", stats, err)
	}
	if err := rooms.Void(ctx, "k", gap); err != nil {
		t.Fatal(err)
	}
	if h, _, err := rooms.Pop(ctx, "k", gap); err != nil || h.Token != "u" {
		t.Fatalf("Pop after the hand-out was voided = %+v, %v, want u at once", h, err)
	}
	if _, _, err := rooms.Pop(ctx, "k", gap); !errors.Is(err, semaphore.ErrRoomEmpty) {
		t.Fatalf("Pop of the emptied room: %v, want ErrRoomEmpty", err)
	}
	if n, err := rooms.Waiting(ctx, "k"); err != nil || n != 0 {
		t.Fatalf("Waiting of the emptied room = %d, %v", n, err)
	}
}

// TestPacedRoomsRefuseBadArguments: each call says what is wrong with its
// arguments, before any call to Redis.
func TestPacedRoomsRefuseBadArguments(t *testing.T) {
	srv := redistest.Start(t)
	rooms := newService(t, srv.Client()).PacedRooms(false)
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"Park with no key":     func() error { _, err := rooms.Park(ctx, "", "t", time.Minute, false); return err },
		"Park with no token":   func() error { _, err := rooms.Park(ctx, "k", "", time.Minute, false); return err },
		"Park with a ttl of 0": func() error { _, err := rooms.Park(ctx, "k", "t", 0, false); return err },
		"Pop with a gap of 0":  func() error { _, _, err := rooms.Pop(ctx, "k", 0); return err },
		"Duty with no key":     func() error { _, err := rooms.Duty(ctx, ""); return err },
		"Void with no key":     func() error { return rooms.Void(ctx, "", time.Second) },
		"StepAside with no token": func() error {
			return rooms.StepAside(ctx, "k", semaphore.Handout{}, time.Second, time.Minute)
		},
	} {
		if err := call(); err == nil || !strings.HasPrefix(err.Error(), "semaphore: ") {
			t.Errorf("%s: %v, want an error of package semaphore", name, err)
		}
	}
	if n := len(srv.Client().Keys(ctx, "*").Val()); n != 0 {
		t.Errorf("the refused calls left %d keys", n)
	}
}

// TestNotedRooms: RenderedRooms returns the rooms noted after a time, oldest
// first, with their templates, and forgets those noted before another.
func TestNotedRooms(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newService(t, srv.Client())
	start := time.Now().UnixMilli() - 1
	if err := l.NoteRenderedRoom(ctx, "acct:{a}", "acct:x", time.Minute); err != nil {
		t.Fatal(err)
	}
	rooms, err := l.RenderedRooms(ctx, start, start)
	if err != nil || len(rooms) != 1 || rooms[0].Template != "acct:{a}" || rooms[0].Key != "acct:x" || rooms[0].At <= start {
		t.Fatalf("RenderedRooms after one note = %+v, %v", rooms, err)
	}
	seen := rooms[0].At
	if rooms, err := l.RenderedRooms(ctx, seen, start); err != nil || len(rooms) != 0 {
		t.Fatalf("RenderedRooms after the note's time = %+v, %v, want none", rooms, err)
	}
	// Forgotten: nothing noted after the start is left.
	if rooms, err := l.RenderedRooms(ctx, start, seen+1); err != nil || len(rooms) != 0 {
		t.Fatalf("RenderedRooms once forgotten = %+v, %v, want none", rooms, err)
	}
}

// TestPacedRoomsOfOneServiceShareTheDuty: handles of one Service and role
// hold a room's duty as one process; another Service's is told no.
func TestPacedRoomsOfOneServiceShareTheDuty(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	one, other := newService(t, srv.Client()), newService(t, srv.Client())
	if _, err := one.PacedRooms(false).Park(ctx, "k", "t", time.Minute, true); err != nil {
		t.Fatal(err)
	}
	for i, rooms := range []*semaphore.PacedRooms{one.PacedRooms(false), one.PacedRooms(false), other.PacedRooms(false)} {
		onDuty, err := rooms.Duty(ctx, "k")
		if want := i < 2; err != nil || onDuty != want {
			t.Fatalf("handle %d: Duty = %t, %v, want %t", i, onDuty, err, want)
		}
	}
}
