package ratelimit_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/ratelimit"
)

// TestRoomHandsOutOneTokenPerInterval: tokens parked in a key's room are
// handed out in arrival order (a token parked again keeps its place), one
// per interval the limit earns the cost in, once the tokens are due, and
// however many callers ask at once.
func TestRoomHandsOutOneTokenPerInterval(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newLimiter(t, srv.Client(), nil)
	limit := ratelimit.Limit{Rate: 20, Per: time.Second, Burst: 1} // one token per 50 ms
	key := t.Name()
	if _, _, err := l.NextDue(ctx, key, limit, 1); !errors.Is(err, ratelimit.ErrRoomEmpty) {
		t.Fatalf("NextDue of an empty room: %v, want ErrRoomEmpty", err)
	}
	for i, token := range []string{"a", "b", "a", "c"} {
		n, err := l.Park(ctx, key, token, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if want := []int{1, 2, 2, 3}[i]; n != want {
			t.Fatalf("park %q: %d tokens in the room, want %d (a token parked twice keeps its one place)", token, n, want)
		}
	}
	if res, err := l.Take(ctx, key, limit, 1); err != nil || !res.Allowed {
		t.Fatalf("the burst: %+v, %v", res, err)
	}
	// Not due: nobody is handed out, and NextDue says how long to wait.
	h, wait, err := l.NextDue(ctx, key, limit, 1)
	token := h.Token
	if err != nil || token != "" || wait <= 0 || wait > 50*time.Millisecond {
		t.Fatalf("NextDue before the token is due = %q, %s, %v", token, wait, err)
	}
	var got []string
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < 3 && time.Now().Before(deadline) {
		// Three callers ask together, before the task handed out takes its
		// token (it is on its way back to a worker): one at most is handed
		// out.
		handed := 0
		for range 3 {
			h, w, err := l.NextDue(ctx, key, limit, 1)
			token := h.Token
			if errors.Is(err, ratelimit.ErrRoomEmpty) && len(got) == 3 {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if token != "" {
				// The wait after a hand-out is until the next may be due:
				// an interval, or less when this one was late.
				if w <= 0 || w > 50*time.Millisecond {
					t.Fatalf("NextDue handed out %q and says to ask again in %s, want (0, 50ms]", token, w)
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
			if _, err := l.Take(ctx, key, limit, 1); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(wait) // the time NextDue said; it is the event itself
	}
	if len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
		t.Fatalf("handed out %v, want [a b c]", got)
	}
	if _, _, err := l.NextDue(ctx, key, limit, 1); !errors.Is(err, ratelimit.ErrRoomEmpty) {
		t.Fatalf("NextDue after the last: %v, want ErrRoomEmpty", err)
	}
}

// TestOneProcessHandsOutARoom: of two processes that ask for a room's
// next token, the first holds the duty and the other is told to ask again
// after DutyLease, handing nothing out; once the holder stops asking, the
// other takes the duty over within about two leases, and hands out the
// rest in order.
func TestOneProcessHandsOutARoom(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	first := newLimiter(t, srv.Client(), nil)
	second := newLimiter(t, srv.Client(), nil)
	limit := ratelimit.Limit{Rate: 1000, Per: time.Second, Burst: 1}
	key := t.Name()
	for _, token := range []string{"a", "b", "c"} {
		if _, err := first.Park(ctx, key, token, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if h, _, err := first.NextDue(ctx, key, limit, 1); err != nil || h.Token != "a" {
		t.Fatalf("the first process's NextDue = %q, %v, want a", h.Token, err)
	}
	h, wait, err := second.NextDue(ctx, key, limit, 1)
	token := h.Token
	if err != nil || token != "" || wait != ratelimit.DutyLease {
		t.Fatalf("the second process's NextDue while the first holds the duty = %q, %s, %v, want \"\", %s", token, wait, err, ratelimit.DutyLease)
	}
	// The first stops asking: the second takes over.
	start := time.Now()
	var got []string
	for len(got) < 2 {
		if time.Since(start) > 3*ratelimit.DutyLease {
			t.Fatalf("after %s the second process handed out %v, want [b c]", time.Since(start), got)
		}
		h, wait, err := second.NextDue(ctx, key, limit, 1)
		token := h.Token
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			got = append(got, token)
			continue
		}
		time.Sleep(min(wait, 100*time.Millisecond)) // the time NextDue said, at most a tenth of the lease
	}
	if got[0] != "b" || got[1] != "c" {
		t.Fatalf("handed out %v, want [b c]", got)
	}
	for _, l := range []*ratelimit.Limiter{first, second} {
		if _, _, err := l.NextDue(ctx, key, limit, 1); !errors.Is(err, ratelimit.ErrRoomEmpty) {
			t.Fatalf("NextDue of the emptied room: %v, want ErrRoomEmpty", err)
		}
	}
}

// TestEnqueueOnlyHandsOutForWorkers: a producer's Limiter (EnqueueOnly)
// hands nothing out of a room while no worker's Limiter asked for its
// duty, so that no task is brought back for nobody to run; a worker's
// Limiter takes the duty over from it at once and hands the first token
// out, and the producer's is then told to ask again after DutyLease.
func TestEnqueueOnlyHandsOutForWorkers(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	producer, err := ratelimit.New(srv.Client(), ratelimit.Options{Prefix: "test:", EnqueueOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	worker := newLimiter(t, srv.Client(), nil)
	limit := ratelimit.Limit{Rate: 1000, Per: time.Second, Burst: 1}
	key := t.Name()
	for _, token := range []string{"a", "b"} {
		if _, err := producer.Park(ctx, key, token, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // the duty taken, then held
		if h, wait, err := producer.NextDue(ctx, key, limit, 1); err != nil || h.Token != "" || wait != ratelimit.DutyLease {
			t.Fatalf("the producer's NextDue with no worker = %q, %s, %v, want \"\", %s", h.Token, wait, err, ratelimit.DutyLease)
		}
	}
	if h, _, err := worker.NextDue(ctx, key, limit, 1); err != nil || h.Token != "a" {
		t.Fatalf("the worker's NextDue while the producer holds the duty = %q, %v, want a", h.Token, err)
	}
	if h, wait, err := producer.NextDue(ctx, key, limit, 1); err != nil || h.Token != "" || wait != ratelimit.DutyLease {
		t.Fatalf("the producer's NextDue after the worker took the duty = %q, %s, %v, want \"\", %s", h.Token, wait, err, ratelimit.DutyLease)
	}
}

// TestStepAsideKeepsTheArrival: a hand-out taken back because its task waits
// in a paused queue (StepAside) does not count against the pace, as Void,
// and the token, parked again once its queue resumes, takes back its
// arrival, ahead of a token parked after it; a token parked anew
// (ParkNew) arrives now.
func TestStepAsideKeepsTheArrival(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newLimiter(t, srv.Client(), nil)
	limit := ratelimit.Limit{Rate: 1, Per: time.Hour, Burst: 1} // one token an hour
	key := t.Name()
	for _, token := range []string{"a", "b"} {
		if _, err := l.Park(ctx, key, token, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	h, _, err := l.NextDue(ctx, key, limit, 1)
	if err != nil || h.Token != "a" || h.Arrival <= 0 {
		t.Fatalf("NextDue = %+v, %v, want a with its arrival", h, err)
	}
	if err := l.StepAside(ctx, key, h, limit, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	// The hand-out did not count: the next is due at once, not in an hour.
	next, _, err := l.NextDue(ctx, key, limit, 1)
	if err != nil || next.Token != "b" {
		t.Fatalf("NextDue after a hand-out stepped aside = %+v, %v, want b at once", next, err)
	}
	if err := l.StepAside(ctx, key, next, limit, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	// c parks, then b and a come back from their queue: a and b are first,
	// in their order of arrival.
	if _, err := l.ParkNew(ctx, key, "c", time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"b", "a"} {
		if _, err := l.Park(ctx, key, token, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for range 3 {
		h, _, err := l.NextDue(ctx, key, limit, 1)
		if err != nil || h.Token == "" {
			t.Fatalf("NextDue after %v = %+v, %v", got, h, err)
		}
		got = append(got, h.Token)
		if err := l.Void(ctx, key, limit, 1); err != nil { // the next at once
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("handed out %v, want [a b c]", got)
	}
}

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
