package admission

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// newPace is a process's roomPace on rdb: a producer's when enqueueOnly.
func newPace(t *testing.T, rdb redis.UniversalClient, enqueueOnly bool) *roomPace {
	t.Helper()
	sem, lim := newStores(t, rdb, semaphore.Options{})
	return &roomPace{rooms: sem.PacedRooms(enqueueOnly), lim: lim, enqueueOnly: enqueueOnly}
}

// TestRoomHandsOutOneTokenPerInterval: tokens parked in a key's room are
// handed out in arrival order (a token parked again keeps its place), one
// per interval the limit earns the cost in, once the tokens are due, and
// however many callers ask at once.
func TestRoomHandsOutOneTokenPerInterval(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newPace(t, srv.Client(), false)
	limit := ratelimit.Limit{Rate: 20, Per: time.Second, Burst: 1} // one token per 50 ms
	key := t.Name()
	if _, _, err := l.next(ctx, key, limit, 1); !errors.Is(err, semaphore.ErrRoomEmpty) {
		t.Fatalf("next of an empty room: %v, want ErrRoomEmpty", err)
	}
	for i, token := range []string{"a", "b", "a", "c"} {
		n, err := l.rooms.Park(ctx, key, token, time.Minute, false)
		if err != nil {
			t.Fatal(err)
		}
		if want := []int{1, 2, 2, 3}[i]; n != want {
			t.Fatalf("park %q: %d tokens in the room, want %d (a token parked twice keeps its one place)", token, n, want)
		}
	}
	if res, err := l.lim.Take(ctx, key, limit, 1); err != nil || !res.Allowed {
		t.Fatalf("the burst: %+v, %v", res, err)
	}
	// Not due: nobody is handed out, and next says how long to wait.
	h, wait, err := l.next(ctx, key, limit, 1)
	token := h.Token
	if err != nil || token != "" || wait <= 0 || wait > 50*time.Millisecond {
		t.Fatalf("next before the token is due = %q, %s, %v", token, wait, err)
	}
	var got []string
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < 3 && time.Now().Before(deadline) {
		// Three callers ask together, before the task handed out takes its
		// token (it is on its way back to a worker): one at most is handed
		// out.
		handed := 0
		for range 3 {
			h, w, err := l.next(ctx, key, limit, 1)
			token := h.Token
			if errors.Is(err, semaphore.ErrRoomEmpty) && len(got) == 3 {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if token != "" {
				// The wait after a hand-out is until the next may be due:
				// an interval, or less when this one was late.
				if w <= 0 || w > 50*time.Millisecond {
					t.Fatalf("next handed out %q and says to ask again in %s, want (0, 50ms]", token, w)
				}
				handed++
				got = append(got, token)
			}
			wait = w
		}
		if handed > 1 {
			t.Fatalf("%d tokens handed out at once", handed)
		}
		if handed == 1 {
			if _, err := l.lim.Take(ctx, key, limit, 1); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(wait) // the time next said; it is the event itself
	}
	if len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
		t.Fatalf("handed out %v, want [a b c]", got)
	}
	if _, _, err := l.next(ctx, key, limit, 1); !errors.Is(err, semaphore.ErrRoomEmpty) {
		t.Fatalf("next after the last: %v, want ErrRoomEmpty", err)
	}
}

// TestOneProcessHandsOutARoom: of two processes that ask for a room's
// next token, the first holds the duty and the other is told to ask again
// after semaphore.DutyLease, handing nothing out; once the holder stops
// asking, the other takes the duty over within about two leases, and
// hands out the rest in order.
func TestOneProcessHandsOutARoom(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	first := newPace(t, srv.Client(), false)
	second := newPace(t, srv.Client(), false)
	limit := ratelimit.Limit{Rate: 1000, Per: time.Second, Burst: 1}
	key := t.Name()
	first.park(t, key, "a", "b", "c")
	if h, _, err := first.next(ctx, key, limit, 1); err != nil || h.Token != "a" {
		t.Fatalf("the first process's next = %q, %v, want a", h.Token, err)
	}
	h, wait, err := second.next(ctx, key, limit, 1)
	token := h.Token
	if err != nil || token != "" || wait != semaphore.DutyLease {
		t.Fatalf("the second process's next while the first holds the duty = %q, %s, %v, want \"\", %s", token, wait, err, semaphore.DutyLease)
	}
	// The first stops asking: the second takes over.
	start := time.Now()
	var got []string
	for len(got) < 2 {
		if time.Since(start) > 3*semaphore.DutyLease {
			t.Fatalf("after %s the second process handed out %v, want [b c]", time.Since(start), got)
		}
		h, wait, err := second.next(ctx, key, limit, 1)
		token := h.Token
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			got = append(got, token)
			continue
		}
		time.Sleep(min(wait, 100*time.Millisecond)) // the time next said, at most a tenth of the lease
	}
	if got[0] != "b" || got[1] != "c" {
		t.Fatalf("handed out %v, want [b c]", got)
	}
	for _, l := range []*roomPace{first, second} {
		if _, _, err := l.next(ctx, key, limit, 1); !errors.Is(err, semaphore.ErrRoomEmpty) {
			t.Fatalf("next of the emptied room: %v, want ErrRoomEmpty", err)
		}
	}
}

// TestEnqueueOnlyHandsOutForWorkers: a producer's roomPace (enqueueOnly)
// hands nothing out of a room while no worker's asked for its duty, so
// that no task is brought back for nobody to run; a worker's takes the
// duty over from it at once and hands the first token out, and the
// producer's is then told to ask again after DutyLease.
func TestEnqueueOnlyHandsOutForWorkers(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	producer := newPace(t, srv.Client(), true)
	worker := newPace(t, srv.Client(), false)
	limit := ratelimit.Limit{Rate: 1000, Per: time.Second, Burst: 1}
	key := t.Name()
	producer.park(t, key, "a", "b")
	for range 2 { // the duty taken, then held
		if h, wait, err := producer.next(ctx, key, limit, 1); err != nil || h.Token != "" || wait != semaphore.DutyLease {
			t.Fatalf("the producer's next with no worker = %q, %s, %v, want \"\", %s", h.Token, wait, err, semaphore.DutyLease)
		}
	}
	if h, _, err := worker.next(ctx, key, limit, 1); err != nil || h.Token != "a" {
		t.Fatalf("the worker's next while the producer holds the duty = %q, %v, want a", h.Token, err)
	}
	if h, wait, err := producer.next(ctx, key, limit, 1); err != nil || h.Token != "" || wait != semaphore.DutyLease {
		t.Fatalf("the producer's next after the worker took the duty = %q, %s, %v, want \"\", %s", h.Token, wait, err, semaphore.DutyLease)
	}
}

// TestStepAsideKeepsTheArrival: a hand-out taken back because its task waits
// in a paused queue (StepAside) does not count against the pace, as Void,
// and the token, parked again once its queue resumes, takes back its
// arrival, ahead of a token parked after it; a token parked anew
// (fresh) arrives now.
func TestStepAsideKeepsTheArrival(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newPace(t, srv.Client(), false)
	limit := ratelimit.Limit{Rate: 1, Per: time.Hour, Burst: 1} // one token an hour
	key := t.Name()
	l.park(t, key, "a", "b")
	h, _, err := l.next(ctx, key, limit, 1)
	if err != nil || h.Token != "a" || h.Arrival <= 0 {
		t.Fatalf("next = %+v, %v, want a with its arrival", h, err)
	}
	if err := l.rooms.StepAside(ctx, key, h, paceGap(limit, 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	// The hand-out did not count: the next is due at once, not in an hour.
	next, _, err := l.next(ctx, key, limit, 1)
	if err != nil || next.Token != "b" {
		t.Fatalf("next after a hand-out stepped aside = %+v, %v, want b at once", next, err)
	}
	if err := l.rooms.StepAside(ctx, key, next, paceGap(limit, 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	// c parks, then b and a come back from their queue: a and b are first,
	// in their order of arrival.
	if _, err := l.rooms.Park(ctx, key, "c", time.Minute, true); err != nil {
		t.Fatal(err)
	}
	l.park(t, key, "b", "a")
	var got []string
	for range 3 {
		h, _, err := l.next(ctx, key, limit, 1)
		if err != nil || h.Token == "" {
			t.Fatalf("next after %v = %+v, %v", got, h, err)
		}
		got = append(got, h.Token)
		if err := l.rooms.Void(ctx, key, paceGap(limit, 1)); err != nil { // the next at once
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("handed out %v, want [a b c]", got)
	}
}

// park parks tokens in key's room, each kept in its place when parked
// again.
func (p *roomPace) park(t *testing.T, key string, tokens ...string) {
	t.Helper()
	for _, token := range tokens {
		if _, err := p.rooms.Park(context.Background(), key, token, time.Minute, false); err != nil {
			t.Fatal(err)
		}
	}
}
