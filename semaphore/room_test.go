package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
	"github.com/redis/go-redis/v9"
)

// roomOf is a room with standby places.
func roomOf(standby int) semaphore.Room {
	return semaphore.Room{Standby: standby, Hold: 10 * time.Second, Transit: 10 * time.Second, TTL: time.Minute}
}

// workerRoom is roomOf with the worker's second in transit: a place held
// from a slot (10 s) lasts longer than a test waits, and one in transit
// lapses sooner than it.
func workerRoom(standby int) semaphore.Room {
	room := roomOf(standby)
	room.Transit = time.Second
	return room
}

// inRoom reports whether token is in part (waiting, parked, places,
// aside, ...) of key's room.
func inRoom(t *testing.T, rdb *redis.Client, key, part, token string) bool {
	t.Helper()
	if part == "places" {
		_, _, ok := placeIn(t, rdb, key, token)
		return ok
	}
	err := rdb.ZScore(context.Background(), storeKey(key, part), token).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return err == nil
}

// placeIn is token's standby place in key's room, if it holds one: when
// it lapses (server ms) and the arrival it keeps (a member of places is
// the token, a tab, and the arrival).
func placeIn(t *testing.T, rdb *redis.Client, key, token string) (lapse float64, arrival string, ok bool) {
	t.Helper()
	members, err := rdb.ZRangeWithScores(context.Background(), storeKey(key, "places"), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		tok, at, found := strings.Cut(m.Member.(string), "\t")
		if found && tok == token {
			return m.Score, at, true
		}
	}
	return 0, "", false
}

// placed are the tokens that hold a standby place in key's room.
func placed(t *testing.T, rdb *redis.Client, key string) []string {
	t.Helper()
	members, err := rdb.ZRange(context.Background(), storeKey(key, "places"), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range members {
		members[i], _, _ = strings.Cut(m, "\t")
	}
	return members
}

// wakeLog collects the tokens a Service's OnWake is handed.
type wakeLog chan string

func (w wakeLog) option(o *semaphore.Options) {
	o.OnWake = func(key string, tokens []string) {
		for _, t := range tokens {
			w <- t
		}
	}
}

// next is the next token let out, or fails after 5 s.
func (w wakeLog) next(t *testing.T) string {
	t.Helper()
	select {
	case token := <-w:
		return token
	case <-time.After(5 * time.Second):
		t.Fatal("no token let out of the room within 5s")
		return ""
	}
}

// none checks that no token was let out.
func (w wakeLog) none(t *testing.T) {
	t.Helper()
	select {
	case token := <-w:
		t.Fatalf("token %q let out of the room", token)
	default:
	}
}

// enter has token's task Enter key's room, holder token, with opts.
func enter(t *testing.T, s *semaphore.Service, key string, capacity int, token string, room semaphore.Room, opts ...semaphore.AcquireOption) *semaphore.Entry {
	t.Helper()
	e, err := s.Enter(context.Background(), key, capacity, token, room, append([]semaphore.AcquireOption{semaphore.WithHolder(token)}, opts...)...)
	if err != nil {
		t.Fatalf("Enter %s: %v", token, err)
	}
	return e
}

// wokenService starts a redis-server and a Service on it whose OnWake
// goes to the wakeLog it returns, with a key of the test's own.
func wokenService(t *testing.T) (*redistest.Server, *semaphore.Service, wakeLog, string) {
	t.Helper()
	srv := redistest.Start(t)
	woken := make(wakeLog, 16)
	return srv, newService(t, srv.Client(), woken.option), woken, uniqueKey(t)
}

// seatFrom has e, standing by alone in s for key, Wait for the seat that
// holder gives back, and returns it.
func seatFrom(t *testing.T, s *semaphore.Service, key string, e *semaphore.Entry, holder *semaphore.Permit) *semaphore.Permit {
	t.Helper()
	got := waitInLine(t, s, key, e)
	if err := holder.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := <-got
	if p == nil {
		t.FailNow()
	}
	return p
}

// waitInLine has e Wait for its seat in the background, and returns once
// it waits in line (alone in s), with the channel its seat comes on (nil
// when the wait failed, which the test is told).
func waitInLine(t *testing.T, s *semaphore.Service, key string, e *semaphore.Entry) <-chan *semaphore.Permit {
	t.Helper()
	seat := make(chan *semaphore.Permit, 1)
	report := reporter(t)
	go func() {
		p, err := e.Wait(context.Background(), semaphore.WithWaitTimeout(10*time.Second))
		report(err)
		seat <- p
	}()
	waitfor.Condition(t, 5*time.Second, "the entry waits in line", func() bool { return s.LocalWaiters(key) == 1 })
	return seat
}

// TestRoomLetsOutInArrivalOrder: tasks that find no seat stand by while
// places are free, then go to the room; a token parks once, keeping its
// first place however often its task comes back; a task keeps its place
// from its seat until it starts (Settle); and as places free the tokens
// that came first are let out, each once.
func TestRoomLetsOutInArrivalOrder(t *testing.T) {
	srv := redistest.Start(t)
	woken := make(wakeLog, 16)
	s := newService(t, srv.Client(), woken.option)
	ctx := context.Background()
	key := uniqueKey(t)
	room := roomOf(1)
	parkedKey := storeKey(key, "parked")

	first := enter(t, s, key, 1, "t0", room)
	if first.Permit == nil {
		t.Fatal("the first task found no free seat")
	}
	standing := enter(t, s, key, 1, "t1", room)
	if standing.Permit != nil || !standing.Standby {
		t.Fatalf("second task: permit %v, standby %v; want a standby place", standing.Permit, standing.Standby)
	}
	for _, token := range []string{"t2", "t3", "t2", "t4", "t3", "t2"} {
		e := enter(t, s, key, 1, token, room)
		if e.Permit != nil || e.Standby {
			t.Fatalf("%s: permit %v, standby %v; want the room", token, e.Permit, e.Standby)
		}
	}
	if n := srv.Client().ZCard(ctx, parkedKey).Val(); n != 3 {
		t.Fatalf("%d tokens parked for 3 tasks", n)
	}
	woken.none(t)

	// t1 takes the seat t0 frees; its place goes to t2, the first parked.
	p := seatFrom(t, s, key, standing, first.Permit)
	// t1 keeps its place until it starts.
	woken.none(t)
	if err := standing.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if token := woken.next(t); token != "t2" {
		t.Fatalf("let out %q, want t2 (parked first)", token)
	}
	woken.none(t)
	// t2 comes to a slot and stands by; t1 finishes: t2 takes the seat and
	// t3 is let out.
	e2 := enter(t, s, key, 1, "t2", room)
	if !e2.Standby {
		t.Fatal("t2, let out of the room, has no standby place")
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p2, err := e2.Wait(ctx, semaphore.WithWaitTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := e2.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if token := woken.next(t); token != "t3" {
		t.Fatalf("let out %q, want t3", token)
	}
	_ = p2.Release(ctx)
	left := srv.Client().ZRange(ctx, parkedKey, 0, -1).Val()
	if !slices.Equal(left, []string{"t4"}) {
		t.Fatalf("still parked: %q, want [t4]", left)
	}
}

// TestStandbyBudgetIsFleetWide: however many Services ask, no more tasks
// hold standby places at once than the budget.
func TestStandbyBudgetIsFleetWide(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	key := uniqueKey(t)
	room := roomOf(2)
	services := []*semaphore.Service{newService(t, srv.Client()), newService(t, srv.Client()), newService(t, srv.Client())}
	holder := enter(t, services[0], key, 1, "holder", room)
	if holder.Permit == nil {
		t.Fatal("no seat for the first task")
	}
	standby := 0
	for i := range 12 {
		e := enter(t, services[i%3], key, 1, "task-"+string(rune('a'+i)), room)
		if e.Permit != nil {
			t.Fatalf("task %d took a second seat of capacity 1", i)
		}
		if e.Standby {
			standby++
		}
	}
	if standby != 2 {
		t.Fatalf("%d tasks stand by across 3 Services, budget 2", standby)
	}
	if err := holder.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// fillWithOneStandingBy fills key, a semaphore of one seat, with a holder
// and a token "a" standing by in room's one place, and returns the
// holder's Entry.
func fillWithOneStandingBy(t *testing.T, s *semaphore.Service, key string, room semaphore.Room) *semaphore.Entry {
	t.Helper()
	holder := enter(t, s, key, 1, "holder", room)
	if holder.Permit == nil {
		t.Fatal("no seat")
	}
	if e := enter(t, s, key, 1, "a", room); !e.Standby {
		t.Fatal("a has no standby place")
	}
	return holder
}

// TestRoomPlaces: a stand-by that gives up goes back to the room ahead of
// later tokens; a place that lapses goes back too (Admit lets it out
// again); Dismiss hands a place on; Reserve promises a place to a task not
// in a slot yet only while one is free, and a task parked after it is let
// out when one frees.
func TestRoomPlaces(t *testing.T) {
	srv := redistest.Start(t)
	woken := make(wakeLog, 16)
	s := newService(t, srv.Client(), woken.option)
	ctx := context.Background()
	key := uniqueKey(t)
	room := roomOf(1)
	holder := fillWithOneStandingBy(t, s, key, room)
	if e := enter(t, s, key, 1, "b", room); e.Standby {
		t.Fatal("b stands by beyond the budget")
	}
	// a's wait runs out: back to the room, ahead of b; its place goes to
	// the first in the room, a itself.
	if _, err := s.Park(ctx, key, 1, "a", room); err != nil {
		t.Fatal(err)
	}
	if token := woken.next(t); token != "a" {
		t.Fatalf("let out %q, want a (first to arrive)", token)
	}
	// a never shows up: Dismiss hands its place to b.
	if err := s.Dismiss(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	if token := woken.next(t); token != "b" {
		t.Fatalf("let out %q, want b", token)
	}
	// b's place lapses (its worker died): Admit lets it out again.
	short := semaphore.Room{Standby: 1, Hold: 50 * time.Millisecond, Transit: 50 * time.Millisecond, TTL: time.Minute}
	if e := enter(t, s, key, 1, "b", short); !e.Standby {
		t.Fatal("b lost its place")
	}
	serverClockPasses(t, srv.Client(), 60*time.Millisecond)
	if _, _, err := s.Admit(ctx, key, 1, short); err != nil {
		t.Fatal(err)
	}
	if token := woken.next(t); token != "b" {
		t.Fatalf("let out %q after b's place lapsed, want b", token)
	}
	// A producer's task: no place while b holds the only one.
	if ok, err := s.Reserve(ctx, key, 1, "c", room); err != nil || ok {
		t.Fatalf("Reserve with every place taken = %v, %v", ok, err)
	}
	if _, err := s.Park(ctx, key, 1, "c", room); err != nil {
		t.Fatal(err)
	}
	woken.none(t)
	if err := s.Dismiss(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	if token := woken.next(t); token != "c" {
		t.Fatalf("let out %q, want c", token)
	}
	if err := holder.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// c's place is spoken for: a newcomer gets none, even with a free seat
	// (c takes it when it shows up).
	if ok, err := s.Reserve(ctx, key, 1, "d", room); err != nil || ok {
		t.Fatalf("Reserve while c holds the only place = %v, %v", ok, err)
	}
	c := enter(t, s, key, 1, "c", room)
	if c.Permit == nil {
		t.Fatal("c, let out of the room, found no seat")
	}
	// c keeps its place until it starts.
	if ok, err := s.Reserve(ctx, key, 1, "d", room); err != nil || ok {
		t.Fatalf("Reserve while c, seated, has not started = %v, %v", ok, err)
	}
	if err := c.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Reserve(ctx, key, 1, "d", room); err != nil || !ok {
		t.Fatalf("Reserve with the place free again = %v, %v", ok, err)
	}
}

// TestNewTokensWaitInArrivalOrder: a producer's tokens reserved and parked
// as new (WithNewToken) wait behind those that came before them, and are
// let out first come first served.
func TestNewTokensWaitInArrivalOrder(t *testing.T) {
	srv := redistest.Start(t)
	woken := make(wakeLog, 16)
	s := newService(t, srv.Client(), woken.option)
	ctx := context.Background()
	key := uniqueKey(t)
	room := roomOf(1)
	holder := fillWithOneStandingBy(t, s, key, room)
	for _, token := range []string{"p1", "p2"} {
		if ok, err := s.Reserve(ctx, key, 1, token, room, semaphore.WithNewToken()); err != nil || ok {
			t.Fatalf("Reserve %s with the only place taken = %v, %v", token, ok, err)
		}
		if _, err := s.Park(ctx, key, 1, token, room, semaphore.WithNewToken()); err != nil {
			t.Fatal(err)
		}
	}
	woken.none(t)
	// The place's holder goes each time: the next new token takes it.
	for _, step := range []struct{ gone, next string }{{"a", "p1"}, {"p1", "p2"}} {
		if err := s.Dismiss(ctx, key, step.gone); err != nil {
			t.Fatal(err)
		}
		if token := woken.next(t); token != step.next {
			t.Fatalf("let out %q after %s left, want %s", token, step.gone, step.next)
		}
	}
	if err := holder.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestParkedBacklogOutlivesTheRoomTTL: tokens parked behind others do not
// renew the parked key's TTL themselves (the first one parked does), so
// the room's renewal of its settings, four times a TTL, must: a backlog
// that keeps parking for three TTLs keeps every token, and its key a TTL.
func TestParkedBacklogOutlivesTheRoomTTL(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client(), make(wakeLog, 4).option)
	ctx := context.Background()
	key := uniqueKey(t)
	room := roomOf(1)
	// The renewal comes with the first park in each quarter of the TTL, so
	// the key outlives a stall of this loop of up to half a TTL (200 ms)
	// on a loaded machine; the first park's own TTL alone lapses in the
	// second TTL.
	room.TTL = 400 * time.Millisecond
	holder := fillWithOneStandingBy(t, s, key, room)
	parked := storeKey(key, "parked")
	n := 0
	for start := time.Now(); time.Since(start) < 3*room.TTL; n++ {
		if _, err := s.Park(ctx, key, 1, "p"+strconv.Itoa(n), room, semaphore.WithNewToken()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(room.TTL / 20) // the pace of the backlog, not a wait for anything
	}
	if got := srv.Client().ZCard(ctx, parked).Val(); got != int64(n) {
		t.Fatalf("%d tokens parked over %v, the parked key holds %d", n, 3*room.TTL, got)
	}
	if ttl := srv.Client().PTTL(ctx, parked).Val(); ttl <= 0 {
		t.Fatalf("the parked key's TTL is %v, want at most the room's", ttl)
	}
	if err := holder.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestForceReleaseLetsTokensOut: a force-release lets tokens out for the
// seats it frees, so parked work does not wait for its safety net.
func TestForceReleaseLetsTokensOut(t *testing.T) {
	srv := redistest.Start(t)
	woken := make(wakeLog, 16)
	s := newService(t, srv.Client(), woken.option)
	ctx := context.Background()
	key := uniqueKey(t)
	room := roomOf(0)
	for _, token := range []string{"h1", "h2", "first", "second", "third"} {
		enter(t, s, key, 2, token, room)
	}
	if n, err := s.ForceReleaseAll(ctx, key); err != nil || n != 2 {
		t.Fatalf("ForceReleaseAll = %d, %v; want 2", n, err)
	}
	got := []string{woken.next(t), woken.next(t)}
	slices.Sort(got)
	if !slices.Equal(got, []string{"first", "second"}) {
		t.Fatalf("let out %v; want first and second", got)
	}
	woken.none(t)
}

// TestHandOverLetsTokensOut: a seat handed to a standing-by task in memory
// frees that task's place once it starts: the next token is let out.
func TestHandOverLetsTokensOut(t *testing.T) {
	srv := redistest.Start(t)
	woken := make(wakeLog, 16)
	s := newService(t, srv.Client(), woken.option)
	ctx := context.Background()
	key := uniqueKey(t)
	room := roomOf(1)
	holder := enter(t, s, key, 1, "h", room)
	standing := enter(t, s, key, 1, "a", room)
	enter(t, s, key, 1, "b", room)
	got := make(chan *semaphore.Permit, 1)
	go func() {
		p, err := standing.Wait(ctx, semaphore.WithWaitTimeout(5*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitfor.Condition(t, 5*time.Second, "a waits in line", func() bool { return s.LocalWaiters(key) == 1 })
	handed := s.LocalHandOvers()
	if err := holder.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p := <-got
	if p == nil {
		t.FailNow()
	}
	defer p.Release(ctx)
	if s.LocalHandOvers() == handed {
		t.Fatal("the seat did not go by a local hand-over: the test did not exercise it")
	}
	woken.none(t)
	if err := standing.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if token := woken.next(t); token != "b" {
		t.Fatalf("let out %q, want b", token)
	}
}

// TestSettleForgetsAFairTokensRealArrival: a task of a fair key that stood
// by and took its seat leaves no note of its real arrival once it settles,
// while a token still parked keeps its own.
func TestSettleForgetsAFairTokensRealArrival(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client())
	ctx := context.Background()
	key := uniqueKey(t)
	room := roomOf(1)
	realsKey := storeKey(key, "reals")
	fairEnter := func(token, value string) *semaphore.Entry {
		t.Helper()
		e, err := s.Enter(ctx, key, 1, token, room, semaphore.WithHolder(token), semaphore.WithShare(value, 1))
		if err != nil {
			t.Fatalf("Enter %s: %v", token, err)
		}
		return e
	}
	first := fairEnter("t0", "a")
	standing := fairEnter("t1", "b")
	parked := fairEnter("t2", "c")
	if first.Permit == nil || !standing.Standby || parked.Permit != nil || parked.Standby {
		t.Fatalf("t0 %v, t1 standby %v, t2 %v/%v: want a seat, a standby place and the room", first.Permit, standing.Standby, parked.Permit, parked.Standby)
	}
	if notes := srv.Client().HKeys(ctx, realsKey).Val(); !slices.Equal(notes, []string{"t1", "t2"}) {
		t.Fatalf("real arrivals noted for %q, want t1 and t2", notes)
	}
	p := seatFrom(t, s, key, standing, first.Permit)
	if err := standing.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if notes := srv.Client().HKeys(ctx, realsKey).Val(); !slices.Equal(notes, []string{"t2"}) {
		t.Fatalf("real arrivals noted for %q after t1 settled, want t2 alone", notes)
	}
	_ = p.Release(ctx)
}

// TestLapsedPlaceParksWithATTL: a place whose task never showed up goes
// back among the parked when the room is swept, and the parked key that
// makes lapses with the room like the others.
func TestLapsedPlaceParksWithATTL(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client(), make(wakeLog, 4).option)
	ctx := context.Background()
	key := uniqueKey(t)
	short := semaphore.Room{Standby: 1, Hold: 50 * time.Millisecond, Transit: 50 * time.Millisecond, TTL: time.Minute}
	if e := enter(t, s, key, 1, "holder", short); e.Permit == nil {
		t.Fatal("the first task found no free seat")
	}
	if ok, err := s.Reserve(ctx, key, 1, "r", short); err != nil || !ok {
		t.Fatalf("Reserve with a place free = %v, %v", ok, err)
	}
	parked := lapseIntoParked(t, srv, s, key, short, "r")
	if ttl := srv.Client().PTTL(ctx, parked).Val(); ttl <= 0 {
		t.Fatalf("the parked key's TTL is %v, want the room's", ttl)
	}
}

// lapseIntoParked lets the server's clock pass token's place in key's
// room (of transit under 60 ms), has a sweep that lets nobody out find it
// lapsed, checks that token went back among the parked, and returns the
// parked key.
func lapseIntoParked(t *testing.T, srv *redistest.Server, s *semaphore.Service, key string, room semaphore.Room, token string) string {
	t.Helper()
	serverClockPasses(t, srv.Client(), 60*time.Millisecond)
	closed := room
	closed.Standby = 0 // the sweep lets nobody out again
	if _, _, err := s.Admit(context.Background(), key, 1, closed); err != nil {
		t.Fatal(err)
	}
	parked := storeKey(key, "parked")
	if err := srv.Client().ZScore(context.Background(), parked, token).Err(); err != nil {
		t.Fatalf("%s, whose place lapsed, is not parked: %v", token, err)
	}
	return parked
}

// TestPresenceStaysCurrentWhileEntersSkipIt: a task that stands by leaves
// the process's presence in the room alone when the process renewed it
// lately (its recheck loop renews it while tasks stand by there); the
// presence must stay current all along, or the seats of other processes'
// releases would pass its tasks over.
func TestPresenceStaysCurrentWhileEntersSkipIt(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	key := uniqueKey(t)
	room := roomOf(1000)
	holder := enter(t, newService(t, srv.Client()), key, 1, "holder", room)
	if holder.Permit == nil {
		t.Fatal("no seat for the first task")
	}
	s := newService(t, srv.Client())
	rdb := srv.Client()
	deadline := time.Now().Add(4 * time.Second) // beyond the presence's 3 s
	for i := 0; time.Now().Before(deadline); i++ {
		if e := enter(t, s, key, 1, "task-"+strconv.Itoa(i), room); !e.Standby {
			t.Fatalf("task %d has no standby place", i)
		}
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		procs, err := rdb.ZRangeWithScores(ctx, storeKey(key, "procs"), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(procs) != 1 {
			t.Fatalf("after %d enters, %d processes present, want 1", i+1, len(procs))
		}
		if lapse := time.UnixMilli(int64(procs[0].Score)); !lapse.After(now) {
			t.Fatalf("after %d enters over %v the process's presence lapsed at %v (server now %v)",
				i+1, 4*time.Second-time.Until(deadline), lapse.Format(time.StampMilli), now.Format(time.StampMilli))
		}
		time.Sleep(50 * time.Millisecond) // the pace of tasks coming to their slots
	}
	if err := holder.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestStartOnSeatGivesThePlaceOnWithTheSeat: a task that starts as its seat
// comes (WithStartOnSeat), given the seat by a release of its own Service,
// gives its standby place on in that release: the next token holds the
// place when the seat arrives, Settle makes no call of its own, and the
// token is brought back only once the task settles (it left its slot's
// wait). A fair key's note of its real arrival goes too. Without the
// option the place waits for Settle.
func TestStartOnSeatGivesThePlaceOnWithTheSeat(t *testing.T) {
	for _, starts := range []bool{true, false} {
		t.Run(fmt.Sprint("starts=", starts), func(t *testing.T) {
			srv, s, woken, key := wokenService(t)
			ctx, room, rdb := context.Background(), roomOf(1), srv.Client()
			enterAs := func(token string) *semaphore.Entry {
				t.Helper()
				opts := []semaphore.AcquireOption{semaphore.WithShare("tenant-"+token, 1)}
				if starts {
					opts = append(opts, semaphore.WithStartOnSeat())
				}
				return enter(t, s, key, 1, token, room, opts...)
			}
			first, standing, parked := enterAs("t0"), enterAs("t1"), enterAs("t2")
			if first.Permit == nil || !standing.Standby || parked.Permit != nil || parked.Standby {
				t.Fatalf("t0 %v, t1 standby %v, t2 %v/%v: want a seat, a standby place and the room", first.Permit, standing.Standby, parked.Permit, parked.Standby)
			}
			// A recheck of the line that reads the store between the
			// release's script and its reply hands t1 its seat without
			// the places' news, and the release then wakes t2 at once (a
			// slot over the budget for a moment). Release just after a
			// recheck whose loop then sleeps long.
			waitfor.Condition(t, 10*time.Second, "the recheck loop sleeps long", func() bool {
				return s.LineBackoff(key) >= 500*time.Millisecond
			})
			p := seatFrom(t, s, key, standing, first.Permit)
			defer func() { _ = p.Release(ctx) }()
			places := placed(t, rdb, key)
			want := []string{"t1"}
			if starts {
				want = []string{"t2"}
			}
			if !slices.Equal(places, want) {
				t.Fatalf("places %q once t1 has its seat, want %q", places, want)
			}
			if starts {
				// t2 is handed to OnWake by t1's Settle, not before.
				if later := standing.PendingWakes(); !slices.Equal(later, []string{"t2"}) {
					t.Fatalf("t1's Entry brings %q back as it settles, want t2", later)
				}
				woken.none(t)
				if notes := rdb.HKeys(ctx, storeKey(key, "reals")).Val(); !slices.Equal(notes, []string{"t2"}) {
					t.Fatalf("real arrivals noted for %q once t1's place went on, want t2 alone", notes)
				}
			}
			if !standing.HoldsPlace() {
				t.Fatal("t1's Entry holds no place before Settle")
			}
			if err := standing.Settle(ctx); err != nil {
				t.Fatal(err)
			}
			if got := woken.next(t); got != "t2" {
				t.Fatalf("let out %q after t1 settled, want t2", got)
			}
			if places := placed(t, rdb, key); !slices.Equal(places, []string{"t2"}) {
				t.Fatalf("places %q after t1 settled, want t2", places)
			}
		})
	}
}

// TestPlaceMadeAgainGoesWithItsSeat: a place keeps its token's arrival in
// its member, as the call that made it wrote the arrival; a caller that
// names the arrival it knows saves looking for the place. When the place
// was made again since with the arrival written another way (it lapsed,
// and the token was let out again), the release that seats the token
// still finds the place and gives it up.
func TestPlaceMadeAgainGoesWithItsSeat(t *testing.T) {
	srv, s, _, key := wokenService(t)
	ctx, room, rdb := context.Background(), roomOf(1), srv.Client()
	first := enter(t, s, key, 1, "t0", room)
	standing := enter(t, s, key, 1, "t1", room, semaphore.WithStartOnSeat())
	if first.Permit == nil || !standing.Standby {
		t.Fatalf("t0 %v, t1 standby %v: want a seat and a standby place", first.Permit, standing.Standby)
	}
	lapse, arrival, ok := placeIn(t, rdb, key, "t1")
	if !ok {
		t.Fatal("t1 stands by without a place")
	}
	// The same arrival, written another way.
	places := storeKey(key, "places")
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, places, "t1\t"+arrival)
		p.ZAdd(ctx, places, redis.Z{Score: lapse, Member: "t1\t0" + arrival})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	p := seatFrom(t, s, key, standing, first.Permit)
	defer func() { _ = p.Release(ctx) }()
	if got := placed(t, rdb, key); len(got) != 0 {
		t.Fatalf("places %q once t1 started on its seat, want none", got)
	}
}

// TestStandbyRenewsAWaitingRoomAboutToLapse: the keys of the tasks waiting
// in slots live as long as their processes' rechecks renew them (two
// presence TTLs at a time); a task that stands by while they are less than
// a presence's TTL from lapsing (the processes of the tasks in them died)
// renews them, or it would lapse with them.
func TestStandbyRenewsAWaitingRoomAboutToLapse(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	rdb := srv.Client()
	key := uniqueKey(t)
	room := roomOf(10)
	holder := enter(t, newService(t, rdb), key, 1, "holder", room)
	if holder.Permit == nil {
		t.Fatal("no seat for the first task")
	}
	defer func() { _ = holder.Permit.Release(ctx) }()
	// A process that dies with a task standing by: its client goes, so
	// its rechecks renew nothing, and the last one's TTL runs out soon.
	gone := srv.Client()
	if e := enter(t, newService(t, gone), key, 1, "gone", room); !e.Standby {
		t.Fatal("gone has no standby place")
	}
	_ = gone.Close()
	for _, part := range []string{"waiting", "slots"} {
		if err := rdb.PExpire(ctx, storeKey(key, part), time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if e := enter(t, newService(t, rdb), key, 1, "next", room); !e.Standby {
		t.Fatal("next has no standby place")
	}
	for _, part := range []string{"waiting", "slots"} {
		if ttl := rdb.PTTL(ctx, storeKey(key, part)).Val(); ttl < 3*time.Second {
			t.Errorf("the %s key lapses in %v after a task stood by in it", part, ttl)
		}
	}
}

// TestLastStartOnSeatLeavesNoRoom: the release that gives the last task
// waiting for a key its seat and its place on (WithStartOnSeat) leaves
// the room empty, and the room keeps no key, as when the task's own
// settle empties it.
func TestLastStartOnSeatLeavesNoRoom(t *testing.T) {
	srv, s, _, key := wokenService(t)
	ctx, room := context.Background(), roomOf(1)
	first := enter(t, s, key, 1, "t0", room, semaphore.WithStartOnSeat())
	last := enter(t, s, key, 1, "t1", room, semaphore.WithStartOnSeat())
	if first.Permit == nil || !last.Standby {
		t.Fatalf("t0 %v, t1 standby %v: want a seat and a standby place", first.Permit, last.Standby)
	}
	p := seatFrom(t, s, key, last, first.Permit)
	defer func() { _ = p.Release(ctx) }()
	if n := srv.Client().Exists(ctx, storeKey(key, "room"), storeKey(key, "places")).Val(); n != 0 {
		t.Fatalf("%d of the room's keys left once its last task had its seat and its place went on", n)
	}
	if err := last.Settle(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestParkLetsOutWhenTheRoomIsGone: a task that gives up its standby place
// while its room's settings are gone (the room was left empty a moment
// before and dropped them, or they lapsed) and a seat is free is let out
// again with the defaults, and the places' keys get a TTL: the call must
// not fail half way (a place key without a TTL, and nobody woken).
func TestParkLetsOutWhenTheRoomIsGone(t *testing.T) {
	srv, s, woken, key := wokenService(t)
	ctx, room, rdb := context.Background(), roomOf(1), srv.Client()
	first := enter(t, s, key, 1, "t0", room, semaphore.WithTTL(50*time.Millisecond))
	standing := enter(t, s, key, 1, "t1", room)
	if first.Permit == nil || !standing.Standby {
		t.Fatalf("t0 %v, t1 standby %v: want a seat and a standby place", first.Permit, standing.Standby)
	}
	serverClockPasses(t, rdb, 100*time.Millisecond) // t0's lease lapses: a seat is free
	if err := rdb.Del(ctx, storeKey(key, "room")).Err(); err != nil {
		t.Fatal(err)
	}
	if err := standing.Park(ctx); err != nil {
		t.Fatal(err)
	}
	if got := woken.next(t); got != "t1" {
		t.Fatalf("let out %q, want t1", got)
	}
	if ttl := rdb.PTTL(ctx, storeKey(key, "places")).Val(); ttl <= 0 {
		t.Errorf("the places key has TTL %v once t1 was let out again", ttl)
	}
}

// TestEnterOfATokenLetOutHere: a task whose token this Service let out
// enters without looking its place up (it knows the arrival), renewing the
// place as it looks for it: the place then lasts Hold, not Transit. A
// token whose place lapsed meanwhile, and which went back among the
// parked, is not taken for placed: it leaves the parked for its place.
// (Two keys: a task standing by on the first would have its process's
// recheck let the second's lapsed token out again.)
func TestEnterOfATokenLetOutHere(t *testing.T) {
	srv := redistest.Start(t)
	woken := make(wakeLog, 16)
	s := newService(t, srv.Client(), woken.option)
	ctx := context.Background()
	standing, lapsing := uniqueKey(t)+"-standing", uniqueKey(t)+"-lapsing"
	room := semaphore.Room{Standby: 1, Hold: 10 * time.Second, Transit: 50 * time.Millisecond, TTL: time.Minute}
	for _, key := range []string{standing, lapsing} {
		if e := enter(t, s, key, 1, "holder", room); e.Permit == nil {
			t.Fatalf("the first task of %s found no free seat", key)
		}
	}

	// p is let out at once (a place is free); its task comes and stands
	// by, and its place lasts Hold from then.
	if _, err := s.Park(ctx, standing, 1, "p", room); err != nil {
		t.Fatal(err)
	}
	if token := woken.next(t); token != "p" {
		t.Fatalf("let out %q, want p", token)
	}
	if e := enter(t, s, standing, 1, "p", room); !e.Standby {
		t.Fatal("p, let out, has no standby place")
	}
	serverClockPasses(t, srv.Client(), 60*time.Millisecond) // past Transit
	if _, _, err := s.Admit(ctx, standing, 1, room); err != nil {
		t.Fatal(err)
	}
	lapses, _, ok := placeIn(t, srv.Client(), standing, "p")
	if !ok {
		t.Fatal("p holds no place")
	}
	now, err := srv.Client().Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Duration(int64(lapses)-now.UnixMilli()) * time.Millisecond; left < time.Second {
		t.Fatalf("p's place lapses in %s, want about Hold (10s) from its enter", left)
	}

	// q is let out, and its place lapses before its task comes: it goes
	// back among the parked.
	if _, err := s.Park(ctx, lapsing, 1, "q", room); err != nil {
		t.Fatal(err)
	}
	if token := woken.next(t); token != "q" {
		t.Fatalf("let out %q, want q", token)
	}
	parked := lapseIntoParked(t, srv, s, lapsing, room, "q")
	if e := enter(t, s, lapsing, 1, "q", room); !e.Standby {
		t.Fatal("q, first parked with a place free, has no standby place")
	}
	if err := srv.Client().ZScore(ctx, parked, "q").Err(); err != redis.Nil {
		t.Fatalf("q stands by and is still parked (ZSCORE: %v)", err)
	}
	if !inRoom(t, srv.Client(), lapsing, "places", "q") {
		t.Fatal("q stands by without a place")
	}
}

// TestReleaseOfALapsedLeaseWhileArmed: a release whose process rechecks
// the key at a lease expiry still to come skips dropping lapsed leases,
// but only while its own lease surely runs: a shorter lease that lapsed
// meanwhile is still found lost.
func TestReleaseOfALapsedLeaseWhileArmed(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := newService(t, srv.Client())
	other, third := newService(t, srv.Client()), newService(t, srv.Client())
	key := uniqueKey(t)
	room := roomOf(2)
	long := mustAcquire(t, other, key, 2, semaphore.WithTTL(20*time.Second))
	mustAcquire(t, other, key, 2, semaphore.WithTTL(20*time.Second))
	short := semaphore.WithTTL(300 * time.Millisecond)
	first := enter(t, s, key, 2, "t1", room, short)
	// Another process's waiter is next in line, so that t1's release goes
	// through release.lua (not a hand-over to a waiter of its own).
	waiting := make(chan *semaphore.Permit, 1)
	go func() {
		q, err := third.Acquire(ctx, key, 2, semaphore.WithWaitTimeout(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		waiting <- q
	}()
	waitfor.Condition(t, 5*time.Second, "the other waiter in line", func() bool { return third.LocalWaiters(key) == 1 })
	if second := enter(t, s, key, 2, "t2", room, short); !first.Standby || !second.Standby {
		t.Fatal("t1 and t2 do not both stand by")
	}
	got := make(chan *semaphore.Permit, 1)
	go func() {
		p, err := first.Wait(ctx, semaphore.WithWaitTimeout(5*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitfor.Condition(t, 5*time.Second, "t1 and t2 wait in line", func() bool { return s.LocalWaiters(key) == 2 })
	if err := long.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var p *semaphore.Permit
	select {
	case p = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("t1 got no seat within 5s")
	}
	if p == nil {
		t.FailNow()
	}
	serverClockPasses(t, srv.Client(), 400*time.Millisecond) // t1's lease lapses
	if !s.EarliestArmed(key) {
		t.Fatal("t2's recheck is not armed for the long lease: the test sees nothing")
	}
	if s.NoLapse(p) {
		t.Fatal("the release of t1's lapsed lease would skip dropping lapsed leases")
	}
	if err := p.Release(ctx); !errors.Is(err, semaphore.ErrPermitNotHeld) {
		t.Fatalf("release of a lapsed lease: %v, want ErrPermitNotHeld", err)
	}
	select {
	case q := <-waiting:
		if q == nil {
			t.Fatal("the other process's waiter got no seat")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the lapsed seat did not go to the next in line within 5s")
	}
}

// TestStepAsideInTransit: a token let out whose task did not come for its
// place gives the place to the next and keeps its arrival aside; a token
// whose task came (it stands by) or that holds no place (parked) stays as
// it is.
func TestStepAsideInTransit(t *testing.T) {
	srv, s, woken, key := wokenService(t)
	ctx := context.Background()
	room := roomOf(1)
	if e := enter(t, s, key, 1, "holder", room); e.Permit == nil {
		t.Fatal("the first task found no free seat")
	}
	for _, token := range []string{"a", "b"} {
		if _, err := s.Park(ctx, key, 1, token, room); err != nil {
			t.Fatal(err)
		}
	}
	if token := woken.next(t); token != "a" {
		t.Fatalf("let out %q, want a", token)
	}
	// b holds no place: it stays parked.
	if err := s.StepAsideInTransit(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	parked, aside := storeKey(key, "parked"), storeKey(key, "aside")
	if err := srv.Client().ZScore(ctx, parked, "b").Err(); err != nil {
		t.Fatalf("b, parked, left the parked: %v", err)
	}
	woken.none(t)
	// a is in transit: its place goes to b, and it keeps its arrival.
	_, arrival, _ := placeIn(t, srv.Client(), key, "a")
	if err := s.StepAsideInTransit(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	if token := woken.next(t); token != "b" {
		t.Fatalf("let out %q, want b in a's place", token)
	}
	if got, err := srv.Client().ZScore(ctx, aside, "a").Result(); err != nil || strconv.FormatFloat(got, 'f', -1, 64) != arrival {
		t.Fatalf("a aside at %v (%v), want its arrival %s", got, err, arrival)
	}
	// b's task comes and stands by: it keeps its place.
	if e := enter(t, s, key, 1, "b", room); !e.Standby {
		t.Fatal("b, let out, has no standby place")
	}
	if err := s.StepAsideInTransit(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	if !inRoom(t, srv.Client(), key, "places", "b") {
		t.Fatal("b, standing by, lost its place")
	}
	if err := srv.Client().ZScore(ctx, storeKey(key, "waiting"), "b").Err(); err != nil {
		t.Fatalf("b, standing by, left the line: %v", err)
	}
}

// TestStandbyOfAGoneProcessStepsAside: a task standing by in a process
// that is no longer heard of (its worker died, or lost Redis) gives its
// standby place on as soon as a seat frees, not when the place lapses: the
// tokens parked behind it are let out, and it keeps its arrival (aside)
// for when its task comes back. So it does 3 s after its process's
// presence lapsed, while a live process waiting for the key keeps the
// line (a release passes it over in line), and once the keys of the line
// lapsed (the release finds a seat free, the places full, nobody in line
// and no process heard of).
func TestStandbyOfAGoneProcessStepsAside(t *testing.T) {
	for _, lapsed := range []string{"presence", "line"} {
		t.Run(lapsed, func(t *testing.T) {
			t.Parallel()
			srv, s, woken, key := wokenService(t)
			ctx, rdb := context.Background(), srv.Client()
			room := workerRoom(1)
			holder := enter(t, s, key, 1, "holder", room)
			if holder.Permit == nil {
				t.Fatal("the first task found no free seat")
			}
			cut, proxy := proxied(t, srv, 2)
			gone := newService(t, cut)
			if e := enter(t, gone, key, 1, "gone", room); !e.Standby {
				t.Fatal("the gone process's task has no standby place")
			}
			arrival, err := rdb.ZScore(ctx, storeKey(key, "waiting"), "gone").Result()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Park(ctx, key, 1, "parked", room); err != nil {
				t.Fatal(err)
			}
			if !inRoom(t, rdb, key, "parked", "parked") {
				t.Fatal("the parked token was let out: the one place is taken")
			}
			var seated chan *semaphore.Permit
			if lapsed == "presence" {
				// A live process waits behind it, and keeps the line.
				seated = make(chan *semaphore.Permit, 1)
				go func() {
					p, err := s.Acquire(ctx, key, 1, semaphore.WithWaitTimeout(20*time.Second))
					if err != nil {
						t.Error(err)
					}
					seated <- p
				}()
				waitfor.Condition(t, 5*time.Second, "the live waiter waits", func() bool { return s.LocalWaiters(key) == 1 })
			}
			proxy.Cut()
			defer proxy.Restore() // for the gone Service's Close
			waitfor.Condition(t, 10*time.Second, "the gone process's presence lapses, and 3 s more", func() bool {
				line := rdb.Exists(ctx, storeKey(key, "waiting"), storeKey(key, "procs")).Val()
				if lapsed == "line" {
					return line == 0
				}
				ago, ok := oldestLapse(rdb, key)
				return line == 2 && ok && ago >= 3*time.Second
			})
			if err := holder.Permit.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if token := woken.next(t); token != "parked" {
				t.Fatalf("let out %q, want the parked token", token)
			}
			if got, err := rdb.ZScore(ctx, storeKey(key, "aside"), "gone").Result(); err != nil || got != arrival {
				t.Fatalf("the gone process's token is aside at %v (%v), want its arrival %v", got, err, arrival)
			}
			if err := rdb.ZScore(ctx, storeKey(key, "waiting"), "gone").Err(); !errors.Is(err, redis.Nil) {
				t.Fatalf("the gone process's token still waits in line: %v", err)
			}
			if st := roomStats(t, s, key); st.Aside != 1 {
				t.Fatalf("room stats %+v, want the gone process's token aside", st)
			}
			if seated != nil {
				if p := <-seated; p != nil {
					if err := p.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}

// TestSeatTakenPastAGoneStandbyLetsTheNextOut: a task let out of the room
// comes to its slot while a seat is free, behind a standby task of a
// process gone for a while (a live process's heavy waiter, behind them
// both, keeps the line): its enter steps that one aside and takes the
// seat (keeping its own place until it starts), and the place stepped
// aside goes to the next parked token in the same call, not at the next
// release.
func TestSeatTakenPastAGoneStandbyLetsTheNextOut(t *testing.T) {
	srv, s, _, key := wokenService(t)
	ctx, rdb := context.Background(), srv.Client()
	room := roomOf(2)
	const capacity = 2
	holder, other := enter(t, s, key, capacity, "holder", room), enter(t, s, key, capacity, "other", room)
	if holder.Permit == nil || other.Permit == nil {
		t.Fatal("the first two tasks found no free seat")
	}
	cut, proxy := proxied(t, srv, 2)
	gone := newService(t, cut)
	if e := enter(t, gone, key, capacity, "gone", room); !e.Standby {
		t.Fatal("the gone process's task has no standby place")
	}
	for _, token := range []string{"next", "parked"} {
		if _, err := s.Park(ctx, key, capacity, token, room); err != nil {
			t.Fatal(err)
		}
	}
	if !inRoom(t, rdb, key, "places", "next") || !inRoom(t, rdb, key, "parked", "parked") {
		t.Fatal("want the first token parked let out (two places), the second parked")
	}
	heavy := acquireInLineOf(t, s, key, capacity, semaphore.WithWeight(capacity), semaphore.WithWaitTimeout(30*time.Second))
	proxy.Cut()
	defer proxy.Restore() // for the gone Service's Close
	// How long ago the gone process's presence lapsed (0 until it did).
	presence := func() time.Duration {
		ago, ok := oldestLapse(rdb, key)
		if !ok {
			return 0
		}
		return ago
	}
	// A seat frees once the gone process's presence lapsed, but before its
	// task would step aside: the release passes it over, the heavy waiter
	// does not fit, and the seat stays free (the places are full: nobody
	// is let out).
	waitfor.Condition(t, 10*time.Second, "the gone process's presence lapses", func() bool {
		d := presence()
		return d > 0 && d < time.Second
	})
	if err := holder.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !inRoom(t, rdb, key, "waiting", "gone") || !inRoom(t, rdb, key, "parked", "parked") {
		t.Fatal("the release stepped the gone process's task aside already: the test needs it in line")
	}
	// A recheck of s's waiter may step the gone task aside as soon as the
	// presence lapsed 3 s ago, and take the presence with it: then it
	// lapsed 3 s ago too.
	waitfor.Condition(t, 10*time.Second, "the gone process's presence lapsed 3 s ago", func() bool {
		return presence() > 3*time.Second || inRoom(t, rdb, key, "aside", "gone")
	})
	next := enter(t, s, key, capacity, "next", room)
	if next.Permit == nil {
		t.Fatal("the task let out found no seat, though one is free")
	}
	if !inRoom(t, rdb, key, "aside", "gone") {
		t.Fatal("the gone process's task did not step aside")
	}
	if !inRoom(t, rdb, key, "places", "parked") {
		t.Fatal("the place stepped aside did not go to the parked token")
	}
	for _, p := range []*semaphore.Permit{next.Permit, other.Permit} {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	seatedThenRelease(t, heavy, "the heavy waiter got no seat once both were free")
}

// TestSeatedStandbyOfALiveProcessKeepsItsPlace: a task given its seat by
// another process's release keeps its standby place until it starts, even
// while a seat is free, the places are full and nobody is in line, as long
// as processes are heard of: only a dead worker's places are stepped aside
// (see TestStandbyOfAGoneProcessStepsAside).
func TestSeatedStandbyOfALiveProcessKeepsItsPlace(t *testing.T) {
	srv, s, _, key := wokenService(t)
	ctx, rdb := context.Background(), srv.Client()
	room := workerRoom(1)
	var held []*semaphore.Permit
	for _, token := range []string{"h1", "h2"} {
		e := enter(t, s, key, 2, token, room)
		if e.Permit == nil {
			t.Fatalf("%s found no free seat", token)
		}
		held = append(held, e.Permit)
	}
	other := newService(t, rdb)
	if e := enter(t, other, key, 2, "x", room); !e.Standby {
		t.Fatal("x has no standby place")
	}
	if _, err := s.Park(ctx, key, 2, "parked", room); err != nil {
		t.Fatal(err)
	}
	// x gets h1's seat, and does not start yet.
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 5*time.Second, "x gets its seat", func() bool {
		return rdb.ZScore(ctx, storeKey(key, "waiting"), "x").Err() == redis.Nil
	})
	if err := held[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !inRoom(t, rdb, key, "places", "x") {
		t.Fatal("x, seated and not started, lost its place")
	}
	if !inRoom(t, rdb, key, "parked", "parked") {
		t.Fatal("the parked token was let out beside x")
	}
}

// TestDirectSeatKeepsItsPlaceUntilItStarts: a task let out of the room
// that takes a free seat as it comes keeps its place until it starts, even
// when no process has stood by lately (nobody's presence is in the room):
// a sweep in that moment, finding a seat free and the places full, does
// not take it for a dead worker's and let another token out.
func TestDirectSeatKeepsItsPlaceUntilItStarts(t *testing.T) {
	srv, s, woken, key := wokenService(t)
	ctx, rdb := context.Background(), srv.Client()
	room := workerRoom(2)
	for _, token := range []string{"p1", "p2", "p3"} {
		if _, err := s.Park(ctx, key, 2, token, room); err != nil {
			t.Fatal(err)
		}
	}
	// Two seats free and two places: p1 and p2 are let out, p3 waits.
	for range 2 {
		woken.next(t)
	}
	e := enter(t, s, key, 2, "p1", room)
	if e.Permit == nil || !e.HoldsPlace() {
		t.Fatalf("p1 took no free seat keeping its place: %+v", e)
	}
	if n := rdb.Exists(ctx, storeKey(key, "procs")).Val(); n != 0 {
		t.Fatal("a process's presence is in the room: the test needs none")
	}
	if _, _, err := s.Admit(ctx, key, 2, room); err != nil {
		t.Fatal(err)
	}
	if !inRoom(t, rdb, key, "places", "p1") {
		t.Fatal("p1, seated and not started, lost its place to the sweep")
	}
	if !inRoom(t, rdb, key, "parked", "p3") {
		t.Fatal("p3 was let out beside p1 and p2")
	}
}

// TestStalledProcessRejoinsWithItsArrival: a process that was only slow
// (not heard of for over 6 s: a long pause, a stopped VM) finds, when it
// is back, that its task standing by stepped aside and its presence was
// dropped; its next rechecks name its waiters, and the task joins the line
// again with its arrival (no longer aside), and gets the next seat,
// rather than waiting out its wait timeout out of line.
func TestStalledProcessRejoinsWithItsArrival(t *testing.T) {
	ctx := context.Background()
	r := slowStandby(t)
	got := make(chan *semaphore.Permit, 1)
	report := reporter(t)
	go func() {
		p, err := r.standby.Wait(ctx, semaphore.WithWaitTimeout(30*time.Second))
		report(err)
		got <- p
	}()
	// The slow process stalls, and the holder gives its seat back.
	stall(t, r.rdb, r.slow, r.key)
	if err := r.holder.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !inRoom(t, r.rdb, r.key, "aside", "slow") {
		t.Fatal("the stalled task did not step aside (its process renewed its presence meanwhile?)")
	}
	// Another task takes the free seat: the stalled one, back, waits in
	// line again, with its arrival, and no longer counts as aside.
	other := enter(t, r.s, r.key, 1, "other", r.room)
	if other.Permit == nil {
		t.Fatal("the free seat went to nobody")
	}
	waitfor.Condition(t, 8*time.Second, "the stalled task joins the line again", func() bool {
		return inRoom(t, r.rdb, r.key, "waiting", "slow")
	})
	if got, err := r.rdb.ZScore(ctx, storeKey(r.key, "waiting"), "slow").Result(); err != nil || got != r.arrival {
		t.Fatalf("the stalled task waits at %v (%v), want its arrival %v", got, err, r.arrival)
	}
	if st := roomStats(t, r.s, r.key); st.Aside != 0 {
		t.Fatalf("room stats %+v: the stalled task, back in line, still counts as aside", st)
	}
	if err := other.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if p == nil {
			t.FailNow()
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the stalled task did not get the seat given back within 8s")
	}
}

// TestStalledProcessFindsItsPlaceTaken: a stalled process's task standing
// by stepped aside and its place went to the next parked token, whose task
// took the seat; when the process is back, no place is free, so its task
// does not wait in its slot beyond the standby budget: it is parked with
// its arrival, and its wait ends (its task goes back to its queue).
func TestStalledProcessFindsItsPlaceTaken(t *testing.T) {
	ctx := context.Background()
	r := slowStandby(t)
	if _, err := r.s.Park(ctx, r.key, 1, "next", r.room); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		p, err := r.standby.Wait(ctx, semaphore.WithWaitTimeout(30*time.Second))
		if p != nil {
			_ = p.Release(ctx)
		}
		waited <- err
	}()
	stall(t, r.rdb, r.slow, r.key)
	if err := r.holder.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !inRoom(t, r.rdb, r.key, "aside", "slow") || !inRoom(t, r.rdb, r.key, "places", "next") {
		t.Fatal("want the stalled task aside and its place gone to the parked token")
	}
	next := enter(t, r.s, r.key, 1, "next", r.room)
	if next.Permit == nil {
		t.Fatal("the task let out found no seat, though one is free")
	}
	defer func() { _ = next.Permit.Release(ctx) }()
	select {
	case err := <-waited:
		var aerr *semaphore.AcquisitionError
		if !errors.As(err, &aerr) || aerr.Reason != semaphore.ReasonTimeout || !strings.Contains(err.Error(), "standby place went to another task") {
			t.Fatalf("the stalled task's wait ended with %v, want it parked", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the stalled task still waits in its slot, with no place")
	}
	if got, err := r.rdb.ZScore(ctx, storeKey(r.key, "parked"), "slow").Result(); err != nil || got != r.arrival {
		t.Fatalf("the stalled task is parked at %v (%v), want its arrival %v", got, err, r.arrival)
	}
	if inRoom(t, r.rdb, r.key, "waiting", "slow") {
		t.Fatal("the stalled task waits in line beyond the standby budget")
	}
}

// stall makes slow, the only process with a presence in key's room, look
// stalled: right after it renews its presence, once its rechecks are a
// second apart (the next is half a second away at least), its presence is
// made to look 4 s lapsed, as after a stall.
func stall(t *testing.T, rdb *redis.Client, slow *semaphore.Service, key string) {
	t.Helper()
	ctx, procs := context.Background(), storeKey(key, "procs")
	presence := func() float64 {
		z := rdb.ZRangeWithScores(ctx, procs, 0, 0).Val()
		if len(z) != 1 {
			return 0
		}
		return z[0].Score
	}
	waitfor.Condition(t, 10*time.Second, "the slow process's rechecks back off", func() bool {
		return slow.LineBackoff(key) >= time.Second
	})
	first := presence()
	waitfor.Condition(t, 5*time.Second, "the slow process renews its presence", func() bool { return presence() != first })
	members := rdb.ZRange(ctx, procs, 0, 0).Val()
	if len(members) != 1 {
		t.Fatalf("presences in the room: %v, want the slow process's", members)
	}
	now := rdb.Time(ctx).Val().UnixMilli()
	if err := rdb.ZAdd(ctx, procs, redis.Z{Score: float64(now - 4000), Member: members[0]}).Err(); err != nil {
		t.Fatal(err)
	}
}

// slowRoom is a room of capacity 1 and one place, whose seat a task of s
// holds (holder) while a task of another process, slow, stands by in the
// place (standby, arriving at arrival).
type slowRoom struct {
	rdb             *redis.Client
	s, slow         *semaphore.Service
	key             string
	room            semaphore.Room
	holder, standby *semaphore.Entry
	arrival         float64
}

// slowStandby starts a slowRoom.
func slowStandby(t *testing.T) slowRoom {
	t.Helper()
	srv, s, _, key := wokenService(t)
	r := slowRoom{rdb: srv.Client(), s: s, key: key, room: workerRoom(1), slow: newService(t, srv.Client())}
	r.holder = enter(t, s, key, 1, "holder", r.room)
	if r.holder.Permit == nil {
		t.Fatal("the first task found no free seat")
	}
	r.standby = enter(t, r.slow, key, 1, "slow", r.room)
	if !r.standby.Standby {
		t.Fatal("the slow process's task has no standby place")
	}
	var err error
	if r.arrival, err = r.rdb.ZScore(context.Background(), storeKey(key, "waiting"), "slow").Result(); err != nil {
		t.Fatal(err)
	}
	return r
}

// oldestLapse is how long ago, by the server's clock, the oldest presence
// in key's room lapsed (negative: it lapses later); false when the room
// holds none. While live processes renew theirs, a gone process's presence
// is the oldest.
func oldestLapse(rdb *redis.Client, key string) (time.Duration, bool) {
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return 0, false
	}
	oldest, err := rdb.ZRangeWithScores(ctx, storeKey(key, "procs"), 0, 0).Result()
	if err != nil || len(oldest) == 0 {
		return 0, false
	}
	return time.Duration(now.UnixMilli()-int64(oldest[0].Score)) * time.Millisecond, true
}

// TestAdmitSweepsOnceAnIntervalFleetWide: with an audit interval, the
// first Admit of the fleet sweeps the room (a lapsed place is let out
// again) and is handed the parked tokens to audit; another process's
// Admit within the interval finds the room swept and changes nothing; one
// without an audit interval (a capacity changed) sweeps at once.
func TestAdmitSweepsOnceAnIntervalFleetWide(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	woken1, woken2 := make(wakeLog, 16), make(wakeLog, 16)
	s1 := newService(t, rdb, woken1.option)
	s2 := newService(t, rdb, woken2.option)
	ctx := context.Background()
	key := uniqueKey(t)
	short := semaphore.Room{Standby: 1, Hold: 50 * time.Millisecond, Transit: 50 * time.Millisecond, TTL: time.Minute}
	audited := short
	audited.Audit = time.Hour
	if holder := enter(t, s1, key, 1, "holder", short); holder.Permit == nil {
		t.Fatal("no seat")
	}
	if ok, err := s1.Reserve(ctx, key, 1, "a", short); err != nil || !ok {
		t.Fatalf("Reserve with a place free = %v, %v", ok, err)
	}
	if _, err := s1.Park(ctx, key, 1, "c", short); err != nil {
		t.Fatal(err)
	}
	lapsed := func() bool {
		t.Helper()
		lapse, _, ok := placeIn(t, rdb, key, "a")
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return ok && lapse <= float64(now.UnixMilli())
	}

	serverClockPasses(t, rdb, 60*time.Millisecond)
	audit, elsewhere, err := s1.Admit(ctx, key, 1, audited)
	if err != nil || elsewhere {
		t.Fatalf("the first Admit: swept elsewhere %v, %v", elsewhere, err)
	}
	if token := woken1.next(t); token != "a" {
		t.Fatalf("the sweep let out %q, want a, whose place lapsed", token)
	}
	if !slices.Equal(audit, []string{"c"}) {
		t.Fatalf("the sweep's audit = %q, want the parked c", audit)
	}

	serverClockPasses(t, rdb, 60*time.Millisecond)
	if !lapsed() {
		t.Fatal("a's place, let out again, has not lapsed")
	}
	if audit, elsewhere, err := s2.Admit(ctx, key, 1, audited); err != nil || len(audit) != 0 || !elsewhere {
		t.Fatalf("an Admit within the interval = %q, swept elsewhere %v, %v; want nothing to audit, swept elsewhere", audit, elsewhere, err)
	}
	if !lapsed() {
		t.Fatal("an Admit within the interval swept the room: a's lapsed place went on")
	}
	if _, _, err := s2.Admit(ctx, key, 1, short); err != nil {
		t.Fatal(err)
	}
	if token := woken2.next(t); token != "a" {
		t.Fatalf("an Admit without an audit interval let out %q, want a", token)
	}
	if lapsed() {
		t.Fatal("an Admit without an audit interval left a's place lapsed")
	}
}
