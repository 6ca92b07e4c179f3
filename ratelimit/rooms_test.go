package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
)

// TestNotedRooms: Rooms returns the rooms noted after a time, oldest
// first, with their templates, and forgets those noted before another.
func TestNotedRooms(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newLimiter(t, srv.Client(), nil)
	start := time.Now().UnixMilli() - 1
	if err := l.NoteRoom(ctx, "acct:{a}", "acct:x", time.Minute); err != nil {
		t.Fatal(err)
	}
	rooms, err := l.Rooms(ctx, start, start)
	if err != nil || len(rooms) != 1 || rooms[0].Template != "acct:{a}" || rooms[0].Key != "acct:x" || rooms[0].At <= start {
		t.Fatalf("Rooms after one note = %+v, %v", rooms, err)
	}
	seen := rooms[0].At
	if rooms, err := l.Rooms(ctx, seen, start); err != nil || len(rooms) != 0 {
		t.Fatalf("Rooms after the note's time = %+v, %v, want none", rooms, err)
	}
	// Forgotten: nothing noted after the start is left.
	if rooms, err := l.Rooms(ctx, start, seen+1); err != nil || len(rooms) != 0 {
		t.Fatalf("Rooms once forgotten = %+v, %v, want none", rooms, err)
	}
}
