package semaphore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// enrolRoom is workerRoom(1) with enrolment on (Room.Enrol).
func enrolRoom() semaphore.Room {
	room := workerRoom(1)
	room.Enrol = true
	return room
}

// slotOf is token's slots entry in key's room ("" when it has none).
func slotOf(t *testing.T, rdb *redis.Client, key, token string) string {
	t.Helper()
	slot, err := rdb.HGet(context.Background(), storeKey(key, "slots"), token).Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return slot
}

// enrolT2 has t0 hold key's one seat, t1 stand by and t2 park, all tasks
// of s that start on their seat, then gives t0's seat back: t1 gets it,
// its place goes on, and t2, let out in it, is enrolled. It returns t1's
// Entry and seat.
func enrolT2(t *testing.T, s *semaphore.Service, key string, room semaphore.Room) (*semaphore.Entry, *semaphore.Permit) {
	t.Helper()
	t0 := enter(t, s, key, 1, "t0", room, semaphore.WithStartOnSeat())
	t1 := enter(t, s, key, 1, "t1", room, semaphore.WithStartOnSeat())
	t2 := enter(t, s, key, 1, "t2", room, semaphore.WithStartOnSeat())
	if t0.Permit == nil || !t1.Standby || t2.Permit != nil || t2.Standby {
		t.Fatalf("t0 %v, t1 standby %v, t2 %v/%v: want a seat, a standby place and the room", t0.Permit, t1.Standby, t2.Permit, t2.Standby)
	}
	seat := waitInLine(t, s, key, t1)
	freshPresence(t, s, key) // (the release enrols only then)
	if err := t0.Permit.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := <-seat
	if p == nil {
		t.FailNow()
	}
	if !s.Enrolled(key, "t2") {
		t.Fatal("t2, let out in t1's place by the release that seated t1, is not enrolled")
	}
	return t1, p
}

// TestEnrolledTokenStandsByWithoutACall: with Room.Enrol, the release that
// gives a task of its process its seat and its place on makes the token it
// lets out in that place a waiter of its process: the token waits in line
// with the process's slot, and its task, brought back as the seated task
// settles, stands by with no store call of its own (its slot is the one
// the release wrote). Its seat comes to it as to any task standing by,
// labelled with its holder.
func TestEnrolledTokenStandsByWithoutACall(t *testing.T) {
	srv, s, woken, key := wokenService(t)
	ctx, room, rdb := context.Background(), enrolRoom(), srv.Client()
	t1, p1 := enrolT2(t, s, key, room)
	if !inRoom(t, rdb, key, "waiting", "t2") {
		t.Fatal("the enrolled t2 does not wait in line")
	}
	slot := slotOf(t, rdb, key, "t2")
	if !strings.HasSuffix(slot, "\tt2") {
		t.Fatalf("t2's slot %q, want it labelled t2", slot)
	}
	// t2 comes back as t1 settles (or at once, when a recheck of t1's
	// line handed t1 its seat before the release's reply did).
	if err := t1.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if got := woken.next(t); got != "t2" {
		t.Fatalf("brought %q back, want t2", got)
	}
	t2 := enter(t, s, key, 1, "t2", room, semaphore.WithStartOnSeat())
	if !t2.Standby || !t2.HoldsPlace() || t2.Permit != nil {
		t.Fatalf("t2 standby %v, place %v, seat %v: want it standing by in its place", t2.Standby, t2.HoldsPlace(), t2.Permit)
	}
	if s.Enrolled(key, "t2") {
		t.Fatal("t2 is still enrolled once its task entered")
	}
	if got := slotOf(t, rdb, key, "t2"); got != slot {
		t.Fatalf("t2's slot %q once its task entered, want the release's %q: the enter made a call", got, slot)
	}
	p2 := seatFrom(t, s, key, t2, p1)
	defer func() { _ = p2.Release(ctx) }()
	holders := rdb.ZRange(ctx, storeKey(key, "holders"), 0, -1).Val()
	if len(holders) != 1 || !strings.HasSuffix(holders[0], "\nt2") {
		t.Fatalf("holders %q once t2 has its seat, want one seat labelled t2", holders)
	}
}

// TestEnrolledTokenNobodyTakesUpParksAgain: an enrolled token whose task
// never comes for it (it was deleted, say) leaves the line within
// enrolTimeout, as a task standing by leaves: parked with its arrival, its
// place given on, here to itself again, first in line.
func TestEnrolledTokenNobodyTakesUpParksAgain(t *testing.T) {
	srv, s, woken, key := wokenService(t)
	ctx, room, rdb := context.Background(), enrolRoom(), srv.Client()
	_, p1 := enrolT2(t, s, key, room)
	defer func() { _ = p1.Release(ctx) }()
	_, arrival, _ := placeIn(t, rdb, key, "t2")
	waitfor.Condition(t, 10*time.Second, "t2's enrolment ends and t2 leaves the line", func() bool {
		return !s.Enrolled(key, "t2") && !inRoom(t, rdb, key, "waiting", "t2")
	})
	if got := woken.next(t); got != "t2" {
		t.Fatalf("let out %q, want t2", got)
	}
	if slotOf(t, rdb, key, "t2") != "" {
		t.Fatal("t2 keeps its slot once its enrolment ended")
	}
	lapse, again, ok := placeIn(t, rdb, key, "t2")
	if !ok || again != arrival {
		t.Fatalf("t2's place %q (held %v), want it let out again with its arrival %q", again, ok, arrival)
	}
	if now := time.Now().UnixMilli(); lapse > float64(now+room.Transit.Milliseconds()+1000) {
		t.Fatalf("t2's place lapses %.0f ms from now, want the room's transit", lapse-float64(now))
	}
}

// TestUnenrolPutsTheTokenBackInTransit: a token whose task OnWake brought
// to its queue rather than to a slot of the process that enrolled it
// (Unenrol) waits in line no more, and holds its place for the room's
// transit, as any token let out; its task stands by wherever it enters.
func TestUnenrolPutsTheTokenBackInTransit(t *testing.T) {
	srv, s, _, key := wokenService(t)
	ctx, room, rdb := context.Background(), enrolRoom(), srv.Client()
	_, p1 := enrolT2(t, s, key, room)
	defer func() { _ = p1.Release(ctx) }()
	s.Unenrol(key, "t2")
	if s.Enrolled(key, "t2") || inRoom(t, rdb, key, "waiting", "t2") || slotOf(t, rdb, key, "t2") != "" {
		t.Fatal("t2 still waits in line as the process's once unenrolled")
	}
	lapse, _, ok := placeIn(t, rdb, key, "t2")
	if now := time.Now().UnixMilli(); !ok || lapse > float64(now+room.Transit.Milliseconds()+1000) {
		t.Fatalf("t2's place held %v, lapsing %.0f ms from now: want it in transit", ok, lapse-float64(now))
	}
	elsewhere := newService(t, srv.Client())
	if e := enter(t, elsewhere, key, 1, "t2", room, semaphore.WithStartOnSeat()); !e.Standby {
		t.Fatal("t2's task does not stand by in another process once unenrolled")
	}
}

// TestEnrolledTokenTakenUpElsewhereStaysThere: a token enrolled by one
// process whose task another process's Enter takes up (no slot was free
// in the first) waits as the other's; when the first's enrolment ends, it
// leaves that wait alone, and the seat goes to the other's task.
func TestEnrolledTokenTakenUpElsewhereStaysThere(t *testing.T) {
	srv, s, _, key := wokenService(t)
	ctx, room, rdb := context.Background(), enrolRoom(), srv.Client()
	_, p1 := enrolT2(t, s, key, room)
	elsewhere := newService(t, srv.Client())
	t2 := enter(t, elsewhere, key, 1, "t2", room, semaphore.WithStartOnSeat())
	if !t2.Standby {
		t.Fatal("t2's task does not stand by in the other process")
	}
	slot := slotOf(t, rdb, key, "t2")
	waitfor.Condition(t, 10*time.Second, "the first process's enrolment of t2 ends", func() bool { return !s.Enrolled(key, "t2") })
	if got := slotOf(t, rdb, key, "t2"); got != slot || !inRoom(t, rdb, key, "waiting", "t2") {
		t.Fatalf("t2's slot %q once the first process's enrolment ended, want the other's %q, in line", got, slot)
	}
	p2 := seatFrom(t, elsewhere, key, t2, p1)
	if err := p2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// holdEnrolment has the first reply of s that enrols want wait, before
// its enrolled tokens are registered, until release is called (or the
// test ends); held is closed as it starts to wait.
func holdEnrolment(t *testing.T, s *semaphore.Service, want string) (held <-chan struct{}, release func()) {
	hold, free := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	s.BeforeEnrol(func(enrolled []string) {
		if enrolled[0] == want && first.CompareAndSwap(false, true) {
			close(hold)
			<-free
		}
	})
	release = sync.OnceFunc(func() { close(free) })
	t.Cleanup(release) // a test that fails while the reply waits does not leave it waiting
	return hold, release
}

// freshPresence has a recheck of key's waiters in s renew the process's
// presence in the room now, so that the release that follows enrols (a
// release enrols only while the presence was renewed within a second:
// see Service.enrols), however slow the machine.
func freshPresence(t *testing.T, s *semaphore.Service, key string) {
	t.Helper()
	before := s.PresentAt(key)
	s.NudgeRecheck(key)
	waitfor.Condition(t, 5*time.Second, "a recheck renews the presence", func() bool { return s.PresentAt(key).After(before) })
}

// releaseHeld releases p in the background, and returns once the reply
// that enrols is held (holdEnrolment's held), with a channel closed once
// the release returned.
func releaseHeld(t *testing.T, p *semaphore.Permit, held <-chan struct{}) <-chan struct{} {
	t.Helper()
	released := make(chan struct{})
	report := reporter(t)
	go func() {
		report(p.Release(context.Background()))
		close(released)
	}()
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the release enrolled nobody")
	}
	return released
}

// seatT2Early has ta and tb hold key's two seats, t1 stand by and t2 and
// t3 park, all tasks of s that start on their seat; then ta's seat goes to
// t1, and t2, let out in t1's place, is enrolled by a reply held back
// (holdEnrolment); then tb's seat goes to t2, which is not registered yet
// (kept early), with t3 let out in t2's place. It returns t1, the channel
// t1's seat comes on, release for the held reply, and a channel closed
// once ta's release returned.
func seatT2Early(t *testing.T, s *semaphore.Service, key string, room semaphore.Room) (t1 *semaphore.Entry, seat1 <-chan *semaphore.Permit, release func(), released <-chan struct{}) {
	t.Helper()
	held, release := holdEnrolment(t, s, "t2")
	opt := semaphore.WithStartOnSeat()
	ta, tb := enter(t, s, key, 2, "ta", room, opt), enter(t, s, key, 2, "tb", room, opt)
	t1 = enter(t, s, key, 2, "t1", room, opt)
	t2, t3 := enter(t, s, key, 2, "t2", room, opt), enter(t, s, key, 2, "t3", room, opt)
	if ta.Permit == nil || tb.Permit == nil || !t1.Standby || t2.Standby || t3.Standby {
		t.Fatal("want two seats taken, t1 standing by, t2 and t3 parked")
	}
	seat1 = waitInLine(t, s, key, t1)
	freshPresence(t, s, key)
	released = releaseHeld(t, ta.Permit, held)
	if err := tb.Permit.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	return t1, seat1, release, released
}

// TestEarlySeatKeepsItsWakesForTheStart: a seat given to an enrolled token
// before the reply that enrolled it is handed on is kept for the token,
// and so are the tokens let out in its place: they come back as its task
// starts (Settle), not as the seat comes, so that a slot holding a task
// that does not run never outnumbers the places (the task of the seated
// token still comes to a slot).
func TestEarlySeatKeepsItsWakesForTheStart(t *testing.T) {
	_, s, woken, key := wokenService(t)
	ctx, room := context.Background(), enrolRoom()
	t1, seat1, release, _ := seatT2Early(t, s, key, room)
	release()
	p1 := <-seat1
	if p1 == nil {
		t.FailNow()
	}
	defer func() { _ = p1.Release(ctx) }()
	if err := t1.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if got := woken.next(t); got != "t2" {
		t.Fatalf("brought %q back first, want t2 (t3 comes as t2's task starts)", got)
	}
	t2 := enter(t, s, key, 2, "t2", room, semaphore.WithStartOnSeat())
	if !t2.Standby {
		t.Fatal("t2's task does not take its enrolment up")
	}
	p2, err := t2.Wait(ctx, semaphore.WithWaitTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p2.Release(ctx) }()
	if got := t2.PendingWakes(); len(got) != 1 || got[0] != "t3" {
		t.Fatalf("t2's seat came with %q to bring back as it starts, want t3", got)
	}
	woken.none(t)
	if err := t2.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if got := woken.next(t); got != "t3" {
		t.Fatalf("brought %q back as t2 started, want t3", got)
	}
}

// TestSeatFoundByARecheckFirstWakesAtOnce: when a recheck hands a task
// standing by the seat a release gave it before the release's reply is
// handed on, the task starts without the tokens let out in its place; the
// reply brings them back at once rather than keeping the seat for an
// enrolment that will never come.
func TestSeatFoundByARecheckFirstWakesAtOnce(t *testing.T) {
	_, s, woken, key := wokenService(t)
	ctx, room := context.Background(), enrolRoom()
	held, release := holdEnrolment(t, s, "t2")
	opt := semaphore.WithStartOnSeat()
	t0, t1, t2 := enter(t, s, key, 1, "t0", room, opt), enter(t, s, key, 1, "t1", room, opt), enter(t, s, key, 1, "t2", room, opt)
	if t0.Permit == nil || !t1.Standby || t2.Standby {
		t.Fatal("want t0 seated, t1 standing by, t2 parked")
	}
	seat1 := waitInLine(t, s, key, t1)
	freshPresence(t, s, key)
	released := releaseHeld(t, t0.Permit, held) // t1's seat; t2 let out and enrolled in its place
	s.MissSeats(key)
	p1 := <-seat1 // the recheck finds it (or the wait fails in 10 s)
	if p1 == nil {
		t.FailNow()
	}
	defer func() { _ = p1.Release(ctx) }()
	if got := t1.PendingWakes(); len(got) != 0 {
		t.Fatalf("t1's seat, found by the recheck, came with %q to bring back", got)
	}
	release()
	<-released
	if s.KeptEarly(key, "t1") {
		t.Fatal("the release's reply kept t1's seat for an enrolment of t1")
	}
	if got := woken.next(t); got != "t2" {
		t.Fatalf("brought %q back, want t2", got)
	}
}

// TestUnenrolSeatedTokenParksFirst: an enrolled token given its seat
// before its task came gave its place on with the seat; when its task
// finds no slot here (Unenrol), the seat goes back, to the next in line,
// and the token parks again with its arrival, first in line, and Unenrol
// says so: its task stays where it waits rather than go to its queue
// without a place.
func TestUnenrolSeatedTokenParksFirst(t *testing.T) {
	srv, s, _, key := wokenService(t)
	ctx, room, rdb := context.Background(), enrolRoom(), srv.Client()
	_, p1 := enrolT2(t, s, key, room)
	if t3 := enter(t, s, key, 1, "t3", room, semaphore.WithStartOnSeat()); t3.Standby || t3.Permit != nil {
		t.Fatal("t3 does not park behind the enrolled t2")
	}
	// The seat goes to the enrolled t2, and t2's place to t3, enrolled.
	freshPresence(t, s, key)
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	holder := func() string {
		holders := rdb.ZRange(ctx, storeKey(key, "holders"), 0, -1).Val()
		if len(holders) != 1 {
			return fmt.Sprint(holders)
		}
		_, label, _ := strings.Cut(holders[0], "\n")
		return label
	}
	waitfor.Condition(t, 5*time.Second, "t2 holds the seat and t3 is enrolled", func() bool {
		return holder() == "t2" && s.Enrolled(key, "t3")
	})
	if !s.Unenrol(key, "t2") {
		t.Fatal("Unenrol of t2, seated, does not say its token parked")
	}
	if got := holder(); got != "t3" {
		t.Fatalf("the seat is held by %s once t2 was unenrolled, want t3, next in line", got)
	}
	if !inRoom(t, rdb, key, "parked", "t2") || s.Enrolled(key, "t2") {
		t.Fatal("t2 is not parked again once unenrolled with its seat")
	}
}

// TestEarlySeatUntakenHandsItsWakesOn: when the reply that enrols a token
// is not handed on (it is held here; a call whose reply was lost does the
// same), the tokens let out in its place with the seat kept early for it
// are not left in their places with nobody to bring their tasks: they come
// back as any token let out whose task does not come (here t3, enrolled,
// leaves after enrolTimeout and is let out again).
func TestEarlySeatUntakenHandsItsWakesOn(t *testing.T) {
	_, s, woken, key := wokenService(t)
	ctx, room := context.Background(), enrolRoom()
	_, seat1, release, released := seatT2Early(t, s, key, room)
	if !s.KeptEarly(key, "t2") {
		t.Fatal("the seat given to t2 before its enrolment was handed on is not kept for it")
	}
	if got := woken.next(t); got != "t3" { // after enrolTimeout, the reply still held
		t.Fatalf("brought %q back, want t3", got)
	}
	release()
	<-released
	if p1 := <-seat1; p1 != nil {
		_ = p1.Release(ctx)
	}
}
