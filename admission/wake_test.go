package admission

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/asynqx"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// TestParkInAnEmptyRoomNudgesTheLoop: a process's loop of a rate limit's
// room that waits a semaphore.DutyLease out (another process held the
// duty) asks again at once when a task parks in the room after it
// emptied, instead of leaving the task there until the lease is out: the
// other process hands out the last token, finds the room empty and gives
// the duty up; then a task parks, and its token is handed out within 300
// ms.
func TestParkInAnEmptyRoomNudgesTheLoop(t *testing.T) {
	a, l := startRateAdmitter(t)
	rdb, ctx := a.Redis, context.Background()
	other := newPace(t, rdb, false)

	// The other process holds the duty of a room with one token in it,
	// which is not due for 200 ms: the burst is spent.
	due := l.Rate
	if _, err := other.rooms.Park(ctx, "api", "first", time.Minute, false); err != nil {
		t.Fatal(err)
	}
	if res, err := other.lim.Take(ctx, "api", due, due.Burst); err != nil || !res.Allowed {
		t.Fatalf("spend the burst: %+v, %v", res, err)
	}
	if h, _, err := other.next(ctx, "api", due, 1); err != nil || h.Token != "" {
		t.Fatalf("the other process's first ask = %q, %v, want the duty and nothing handed out", h.Token, err)
	}
	// This process's loop asks once, hears that the duty is held, and
	// waits the lease out (its ask is the one script call counted here).
	before := redistest.CommandCalls(t, rdb)["evalsha"]
	a.rateWakes.watch(a, l, false)
	waitfor.Condition(t, 5*time.Second, "the loop asks for the room", func() bool {
		return redistest.CommandCalls(t, rdb)["evalsha"] > before
	})

	// The other process hands the token out once it is due (200 ms after
	// the burst was spent), finds the room empty and gives the duty up.
	var handedOut string
	waitfor.Condition(t, 5*time.Second, "the other process hands the token out", func() bool {
		h, _, err := other.next(ctx, "api", due, 1)
		token := h.Token
		if err != nil {
			t.Fatalf("the other process's hand-out: %v", err)
		}
		handedOut = token
		return token != ""
	})
	if handedOut != "first" {
		t.Fatalf("the other process handed out %q, want first", handedOut)
	}
	if _, _, err := other.next(ctx, "api", due, 1); !errors.Is(err, semaphore.ErrRoomEmpty) {
		t.Fatalf("the other process's next ask: %v, want ErrRoomEmpty", err)
	}
	start := time.Now()
	if n, err := a.parkToken(ctx, l, "q\x00late", false); err != nil || n != 1 {
		t.Fatalf("park in the empty room = %d, %v, want 1", n, err)
	}
	waitfor.Condition(t, 300*time.Millisecond, "the token parked in the empty room is handed out", func() bool {
		n, err := a.paced.Waiting(ctx, "api")
		return err == nil && n == 0
	})
	t.Logf("handed out %s after the park", time.Since(start).Round(time.Millisecond))
}

// TestBusyTaskStepsAsideForTheNext: a cap's token let out whose task is
// still in a worker's hands after the wake-up's 200 ms (active: its
// worker died, say, and asynq brings it back only when its lease runs
// out) gives its place to the next token and keeps its arrival aside,
// instead of holding the place while the seats sit idle; a second later
// its task is asked for once more (here it was deleted meanwhile, so its
// token leaves the room).
func TestBusyTaskStepsAsideForTheNext(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	woken := make(chan string, 8)
	sem, err := semaphore.New(rdb, semaphore.Options{OnWake: func(_ string, tokens []string) {
		for _, token := range tokens {
			woken <- token
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	k := NewWaker(rdb, nil)
	k.SetSemaphore(sem)
	next := func() string {
		t.Helper()
		select {
		case token := <-woken:
			return token
		case <-time.After(5 * time.Second):
			t.Fatal("no token let out within 5s")
			return ""
		}
	}
	client := asynq.NewClientFromRedisClient(rdb)
	info, err := client.Enqueue(asynq.NewTask("job", nil), asynq.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	// A worker took the task, and died: it stays active.
	taskKey := asynqx.QueueKeys("q").TaskPrefix + info.ID
	if err := rdb.HSet(ctx, taskKey, "state", "active").Err(); err != nil {
		t.Fatal(err)
	}
	busy, other := Token{Queue: "q", ID: info.ID}.String(), Token{Queue: "q", ID: "other"}.String()
	room := semaphore.Room{Standby: 1, Hold: 10 * time.Second, Transit: 10 * time.Second, TTL: time.Minute}
	if e, err := sem.Enter(ctx, "k", 1, "holder", room); err != nil || e.Permit == nil {
		t.Fatalf("the first task found no seat: %v", err)
	}
	for _, token := range []string{busy, other} {
		if _, err := sem.Park(ctx, "k", 1, token, room); err != nil {
			t.Fatal(err)
		}
	}
	if token := next(); token != busy {
		t.Fatalf("let out %q, want the busy task's token first", token)
	}
	k.OnWake("k", []string{busy})
	if token := next(); token != other {
		t.Fatalf("let out %q, want the next token in the busy one's place", token)
	}
	aside := "fleetcap:sem:{k}:aside"
	if err := rdb.ZScore(ctx, aside, busy).Err(); err != nil {
		t.Fatalf("the busy task's token kept no arrival aside: %v", err)
	}
	// An operator deletes the task: asked for again, it is gone, and its
	// token leaves the room.
	if err := rdb.Del(ctx, taskKey).Err(); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 5*time.Second, "the busy task is asked for again", func() bool {
		return rdb.ZScore(ctx, aside, busy).Err() == redis.Nil
	})
}

// TestBusyTaskStepsAsideFromARateRoom: a rate limit's token handed out
// whose task is still in a worker's hands after the wake-up's 200 ms
// (active: its worker died, say) gives the hand-out back and keeps its
// arrival aside, as a task of a paused queue does, so that it takes its
// old place in line when its task comes back to park, instead of spending
// the hand-out and going to the back of the line.
func TestBusyTaskStepsAsideFromARateRoom(t *testing.T) {
	a, l := startRateAdmitter(t)
	rdb, ctx := a.Redis, context.Background()
	info, err := asynq.NewClientFromRedisClient(rdb).Enqueue(asynq.NewTask("job", nil), asynq.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	// A worker took the task, and died: it stays active.
	if err := rdb.HSet(ctx, asynqx.QueueKeys("q").TaskPrefix+info.ID, "state", "active").Err(); err != nil {
		t.Fatal(err)
	}
	busy := Token{Queue: "q", ID: info.ID}.String()
	before := rdb.Time(ctx).Val().UnixMicro()
	if _, err := a.parkToken(ctx, l, busy, false); err != nil {
		t.Fatal(err)
	}
	after := rdb.Time(ctx).Val().UnixMicro()
	aside := semaphore.DefaultPrefix + "paced:{api}:aside" // the rate limit's paced room
	waitfor.Condition(t, 5*time.Second, "the busy task's token keeps its arrival aside", func() bool {
		arrival, err := rdb.ZScore(ctx, aside, busy).Result()
		return err == nil && int64(arrival) >= before && int64(arrival) <= after
	})
}

// startRateAdmitter starts an Admitter on a redis-server of its own, with
// one rate limit, api (5 a second, burst 1), and returns it and the limit;
// it stops at the test's end.
func startRateAdmitter(t *testing.T) (*Admitter, Limit) {
	t.Helper()
	a := newAdmitter(t, redistest.Start(t).Client(), "tasks: {job: {rate_limits: [{key: api, rate: 5, per: 1s, burst: 1}]}}\n", semaphore.Options{})
	runCtx, stop := context.WithCancel(context.Background())
	t.Cleanup(func() { stop(); a.Wait() })
	a.Start(runCtx)
	return a, Limit{Spec: a.Table.Plain(KindRate)["api"], Key: "api"}.Resized(nil)
}

// newAdmitter is an Admitter on rdb for the config yaml, with a Service of
// opts and a Limiter of its own, closed at the test's end.
func newAdmitter(t testing.TB, rdb *redis.Client, yaml string, opts semaphore.Options) *Admitter {
	t.Helper()
	sem, lim := newStores(t, rdb, opts)
	a, err := New(Options{Redis: rdb, Table: tableFor(t, yaml), Semaphore: sem, Limiter: lim, ParkedRetry: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestSeatedEnrolledTaskStaysWhereItWaits: a token that a release here
// enrolled, and that got its seat before its task came, gave its place on
// with the seat; when no slot here takes its task (this Waker has none),
// the task is not brought to its queue, where the worker that dequeued it
// would find no place and park it again: it stays in asynq's scheduled
// set, its seat goes back, and its token, no longer enrolled here, waits
// in the room for the next seat or place.
func TestSeatedEnrolledTaskStaysWhereItWaits(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sem, err := semaphore.New(rdb, semaphore.Options{OnWake: func(string, []string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	k := NewWaker(rdb, nil)
	k.SetSemaphore(sem)
	info, err := asynq.NewClientFromRedisClient(rdb).Enqueue(asynq.NewTaskWithHeaders("job", nil, map[string]string{WaitsForHeader: "k"}), asynq.Queue("q"), asynq.ProcessIn(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	parked := Token{Queue: "q", ID: info.ID}.String()
	room := semaphore.Room{Standby: 1, Hold: 10 * time.Second, Transit: 10 * time.Second, TTL: time.Minute, Enrol: true}
	enter := func(token string) *semaphore.Entry {
		t.Helper()
		e, err := sem.Enter(ctx, "k", 1, token, room, semaphore.WithStartOnSeat())
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	first, standing := enter("first"), enter("standing")
	if first.Permit == nil || !standing.Standby {
		t.Fatal("want a seat taken and a task standing by")
	}
	if _, err := sem.Park(ctx, "k", 1, parked, room); err != nil {
		t.Fatal(err)
	}
	// The seat goes to the task standing by, whose place goes to the
	// parked token, enrolled here; that seat comes back before the
	// token's task does, and goes to the token.
	if err := first.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := standing.Wait(ctx, semaphore.WithWaitTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	holders := "fleetcap:sem:{k}:holders"
	heldByParked := func() bool {
		t.Helper()
		members, err := rdb.ZRange(ctx, holders, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range members {
			if strings.HasSuffix(m, "\n"+info.ID) {
				return true
			}
		}
		return false
	}
	waitfor.Condition(t, 5*time.Second, "the enrolled token holds the seat", heldByParked)
	k.OnWake("k", []string{parked})
	taskKey := asynqx.QueueKeys("q").TaskPrefix + info.ID
	if state, err := rdb.HGet(ctx, taskKey, "state").Result(); err != nil || state != "scheduled" {
		t.Fatalf("the task is %q (%v), want it still scheduled (parked, as the producer parks a task)", state, err)
	}
	if heldByParked() {
		t.Fatal("the token keeps its seat though its task did not come")
	}
}

// newStores are a Service of opts, closed at the test's end, and a Limiter
// on rdb.
func newStores(t testing.TB, rdb redis.UniversalClient, opts semaphore.Options) (*semaphore.Service, *ratelimit.Limiter) {
	t.Helper()
	sem, err := semaphore.New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	lim, err := ratelimit.New(rdb, ratelimit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return sem, lim
}
