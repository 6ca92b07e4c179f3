package semaphore_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// TestQuickPathNeverOvertakesAWaiter: a seat that lapsed (its holder
// never gave it back) while somebody waits goes to the waiter, not to a
// TryAcquire of another process that finds the seat free: the quick path
// sees the waiter and leaves the call to the waiting room. The seat is
// made to lapse on the store while the waiter's recheck is far off, so
// that the TryAcquire, not the waiter, is the first to find it free.
func TestQuickPathNeverOvertakesAWaiter(t *testing.T) {
	srv := redistest.Start(t)
	key := uniqueKey(t)
	holder, waiter, trier := newService(t, srv.Client()), newService(t, srv.Client()), newService(t, srv.Client())
	ctx := context.Background()
	held := mustAcquire(t, holder, key, 1, semaphore.WithTTL(time.Minute))
	got := acquireInLine(t, waiter, key)
	waitfor.Condition(t, 5*time.Second, "the waiter's recheck is far off", func() bool {
		return waiter.LineBackoff(key) >= 400*time.Millisecond
	})
	now, err := srv.Client().Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	lapsed := redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: held.ID()}
	if err := srv.Client().ZAddXX(ctx, storeKey(key, "holders"), lapsed).Err(); err != nil {
		t.Fatal(err)
	}
	p, err := trier.TryAcquire(ctx, key, 1)
	if err != nil {
		t.Fatal(err)
	}
	if p != nil {
		t.Fatal("TryAcquire took a lapsed seat while a waiter waited for it")
	}
	select {
	case q := <-got:
		if q == nil {
			t.Fatal("the waiter got no seat")
		}
		if err := q.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not given the lapsed seat within 5s")
	}
}

// TestIdleKeyCycleTakesTheQuickPath: a TryAcquire, an Acquire or a task's
// Enter on a key nobody waits for is one call of quick.lua, not the
// waiting room's scripts (which would cost Redis about three times the
// time), and its Release two plain commands (the seat's ZREM, then a look
// at the room) and no script.
func TestIdleKeyCycleTakesTheQuickPath(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	ctx := context.Background()
	// A cycle on another key first loads quick.lua, so that no EVALSHA
	// refused with NOSCRIPT is counted below.
	warm := mustAcquire(t, s, key+"-warm", 10)
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	const cycles = 30
	bySHA, plain := storeCalls(t, srv.Client(), func() {
		for i := range cycles {
			var p *semaphore.Permit
			var err error
			switch i % 3 {
			case 0:
				p, err = s.TryAcquire(ctx, key, 10)
			case 1:
				p, err = s.Acquire(ctx, key, 10)
			case 2:
				var e *semaphore.Entry
				if e, err = s.Enter(ctx, key, 10, "task-"+strconv.Itoa(i), roomOf(1)); err == nil {
					p = e.Permit
				}
			}
			if err != nil || p == nil {
				t.Fatalf("cycle %d on an idle key: %v, %v", i, p, err)
			}
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	if quick := semaphore.QuickScriptHash(); bySHA[quick] != cycles || len(bySHA) != 1 {
		t.Errorf("script calls by SHA1 %v: want %d of quick.lua (%s) and no other", bySHA, cycles, quick)
	}
	if plain["zrem"] != cycles || plain["exists"] != cycles || len(plain) != 2 {
		t.Errorf("commands outside scripts %v: want %d ZREMs and %d EXISTS and no other", plain, cycles, cycles)
	}
}

// storeCalls runs calls (on the caller's goroutine) with every command
// logged in the slow log of admin's Redis, and returns the script calls
// they made, by SHA1, and the commands they sent outside scripts, by name
// (the slow log lists a script's own commands too, without a client's
// address).
func storeCalls(t *testing.T, admin *redis.Client, calls func()) (bySHA, plain map[string]int) {
	t.Helper()
	ctx := context.Background()
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", "10000"}} {
		if err := admin.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	calls()
	entries, err := admin.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	bySHA, plain = map[string]int{}, map[string]int{}
	for _, e := range entries {
		switch name := strings.ToLower(e.Args[0]); {
		case name == "evalsha" && len(e.Args) > 1:
			bySHA[e.Args[1]]++
		case name == "slowlog": // the reset above
		case strings.HasPrefix(e.ClientAddr, "127.0.0.1:"):
			plain[name]++
		}
	}
	return bySHA, plain
}

// TestEnterAfterAsideLeavesNoAside: a token that stepped aside (its task
// waited for another cap) and comes back to a free seat leaves the room
// for good: the quick path, which does not look for tokens, stands aside
// when any token stepped aside, and the room's script forgets it.
func TestEnterAfterAsideLeavesNoAside(t *testing.T) {
	srv := redistest.Start(t)
	s := newService(t, srv.Client())
	key := uniqueKey(t)
	ctx := context.Background()
	if ok, err := s.Reserve(ctx, key, 2, "task-1", roomOf(1)); err != nil || !ok {
		t.Fatalf("Reserve on an idle key: %v, %v", ok, err)
	}
	if err := s.StepAside(ctx, key, "task-1"); err != nil {
		t.Fatal(err)
	}
	asideKey := storeKey(key, "aside")
	if n, err := srv.Client().Exists(ctx, asideKey).Result(); err != nil || n != 1 {
		t.Fatalf("no aside key %s after StepAside: %d, %v", asideKey, n, err)
	}
	e, err := s.Enter(ctx, key, 2, "task-1", roomOf(1))
	if err != nil || e == nil || e.Permit == nil {
		t.Fatalf("Enter to a free seat: %+v, %v", e, err)
	}
	defer e.Permit.Release(ctx)
	if n, err := srv.Client().Exists(ctx, asideKey).Result(); err != nil || n != 0 {
		t.Errorf("the token that took its seat is still aside (%s exists: %d, %v)", asideKey, n, err)
	}
}

// TestQuickTakeDropsLapsedSeatsOnlyWhenFull: a take on the quick path
// counts a lapsed lease as held while live and lapsed ones together leave
// a seat free (it saves the sweep), and drops the lapsed ones once they
// would refuse it: they never keep a seat from a caller, and the live
// seats never pass the capacity. A Release of a seat dropped that way
// reports it lost.
func TestQuickTakeDropsLapsedSeatsOnlyWhenFull(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	key := uniqueKey(t)
	s := newService(t, rdb)
	ctx := context.Background()
	const capacity = 3
	var lapsed []*semaphore.Permit
	for range 2 {
		lapsed = append(lapsed, mustAcquire(t, s, key, capacity, semaphore.WithTTL(time.Minute)))
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range lapsed {
		z := redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: p.ID()}
		if err := rdb.ZAddXX(ctx, storeKey(key, "holders"), z).Err(); err != nil {
			t.Fatal(err)
		}
	}
	members := func() int64 {
		n, err := rdb.ZCard(ctx, storeKey(key, "holders")).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Each take is another process's (a Service that took the last seat
	// sends its next call to the waiting room's scripts, which sweep).
	var live []*semaphore.Permit
	for i, want := range []int64{3, 2, 3} {
		p, err := newService(t, rdb).TryAcquire(ctx, key, capacity)
		if err != nil {
			t.Fatal(err)
		}
		if p == nil {
			t.Fatalf("take %d was refused with %d live seats of %d", i+1, len(live), capacity)
		}
		live = append(live, p)
		if got := members(); got != want {
			t.Errorf("after take %d the key holds %d members (live and lapsed), want %d", i+1, got, want)
		}
	}
	if p, err := newService(t, rdb).TryAcquire(ctx, key, capacity); err != nil || p != nil {
		t.Fatalf("a fourth take with 3 live seats of 3: permit %v, err %v; want none", p, err)
	}
	if used, err := s.UsedPermits(ctx, key); err != nil || used != capacity {
		t.Fatalf("UsedPermits = %d, %v; want %d", used, err, capacity)
	}
	for _, p := range lapsed {
		if err := p.Release(ctx); !errors.Is(err, semaphore.ErrPermitNotHeld) {
			t.Errorf("Release of a lapsed seat dropped by a take: %v, want ErrPermitNotHeld", err)
		}
	}
	for _, p := range live {
		if err := p.Release(ctx); err != nil {
			t.Errorf("Release of a live seat: %v", err)
		}
	}
}

// TestQuickGiveOfALiveLeaseAsksNoClock: giving back a seat on the quick
// path whose lease has over half its TTL to run reads neither the
// server's clock nor the lease: its ZREM says the seat was held.
func TestQuickGiveOfALiveLeaseAsksNoClock(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	s, key := newService(t, rdb), uniqueKey(t)
	ctx := context.Background()
	p := mustAcquire(t, s, key, 5, semaphore.WithTTL(time.Minute))
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	stats, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stats, "cmdstat_zrem:") {
		t.Fatalf("the give made no ZREM; commandstats:\n%s", stats)
	}
	for _, cmd := range []string{"time", "zscore"} {
		if strings.Contains(stats, "cmdstat_"+cmd+":") {
			t.Errorf("the give of a live lease called %s; commandstats:\n%s", strings.ToUpper(cmd), stats)
		}
	}
}

// TestQuickGivePassesTheSeatOnToAWaiter: a Release on the quick path (its
// process saw nobody waiting for the key lately) that finds another
// process's caller waiting passes the seat on: it is the waiter's when
// Release returns, not at the waiter's next recheck. A lease surely live
// goes back with plain commands, which find the waiter once the seat is
// back; one past half its TTL asks quick.lua, which finds the waiter
// first and leaves the seat to release.lua. The slow log says which way
// each give went.
func TestQuickGivePassesTheSeatOnToAWaiter(t *testing.T) {
	for _, tc := range []struct {
		name string
		ttl  time.Duration
		age  time.Duration // how long the seat is held before its Release
		// the give's calls of quick.lua, and its ZREMs outside scripts
		quickCalls, plainZREMs int
	}{
		{"surely live", time.Minute, 0, 0, 1},
		{"past half its TTL", 2 * time.Second, 1100 * time.Millisecond, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.Client()
			key := uniqueKey(t)
			ctx := context.Background()
			giver, other, waiter := newService(t, rdb), newService(t, rdb), newService(t, rdb)
			// Of 2 seats, the giver's took one with another free: the
			// giver saw nobody waiting.
			given := mustAcquire(t, giver, key, 2, semaphore.WithTTL(tc.ttl))
			taken := time.Now()
			kept := mustAcquire(t, other, key, 2, semaphore.WithTTL(time.Minute))
			t.Cleanup(func() {
				if err := kept.Release(ctx); err != nil {
					t.Error(err)
				}
			})
			got := acquireInLineOf(t, waiter, key, 2)
			waitfor.Condition(t, 5*time.Second, "the waiter's recheck is far off, and the seat as old as the case says", func() bool {
				return waiter.LineBackoff(key) >= 400*time.Millisecond && time.Since(taken) >= tc.age
			})
			var released error
			bySHA, plain := storeCalls(t, rdb, func() { released = given.Release(ctx) })
			if released != nil {
				t.Fatal(released)
			}
			if quick := bySHA[semaphore.QuickScriptHash()]; quick != tc.quickCalls || plain["zrem"] != tc.plainZREMs {
				t.Errorf("the give called quick.lua %d times and ZREM %d outside scripts; want %d and %d", quick, plain["zrem"], tc.quickCalls, tc.plainZREMs)
			}
			seats, err := rdb.ZRange(ctx, storeKey(key, "holders"), 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(seats) != 2 || slices.Contains(seats, given.ID()) {
				t.Fatalf("right after the Release the key's seats are %q: want the kept one and the waiter's", seats)
			}
			select {
			case p := <-got:
				if p == nil || !slices.Contains(seats, p.ID()) {
					t.Fatalf("the waiter's permit %v is not the seat the Release passed on (%q)", p, seats)
				}
				if err := p.Release(ctx); err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter was not given the seat within 5s")
			}
		})
	}
}

// TestTakeOfTheLastSeatKeepsTheGiveQuick: a key whose last seat a quick
// take took (a cap reached with nobody waiting, such as a tenant's cap of
// 2) sends its next take to the waiting room's script, which would wait,
// and gives its seats back with the plain commands: no script call.
func TestTakeOfTheLastSeatKeepsTheGiveQuick(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	s, key := newService(t, rdb), uniqueKey(t)
	ctx := context.Background()
	// quick.lua and acquire.lua are loaded on another key first, so that
	// no EVALSHA refused with NOSCRIPT is counted below.
	warm := mustAcquire(t, s, key+"-warm", 1)
	if p, err := s.TryAcquire(ctx, key+"-warm", 1); err != nil || p != nil {
		t.Fatalf("TryAcquire of a full key: %v, %v", p, err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	bySHA, plain := storeCalls(t, rdb, func() {
		first := mustAcquire(t, s, key, 2, semaphore.WithTTL(time.Minute))
		last := mustAcquire(t, s, key, 2, semaphore.WithTTL(time.Minute))
		if p, err := s.TryAcquire(ctx, key, 2); err != nil || p != nil {
			t.Fatalf("TryAcquire of a full key: %v, %v", p, err)
		}
		for _, p := range []*semaphore.Permit{first, last} {
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	quick, acquire := semaphore.QuickScriptHash(), semaphore.AcquireScriptHash()
	if bySHA[quick] != 2 || bySHA[acquire] != 1 || len(bySHA) != 2 {
		t.Errorf("script calls by SHA1 %v: want 2 of quick.lua (%s), the takes, and 1 of acquire.lua (%s), the refused take", bySHA, quick, acquire)
	}
	if plain["zrem"] != 2 || plain["exists"] != 2 || len(plain) != 2 {
		t.Errorf("commands outside scripts %v: want 2 ZREMs and 2 EXISTS, the gives", plain)
	}
}
