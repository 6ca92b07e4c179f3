package admission

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/asynqx"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// Waking parked tasks. A task parked in a limit's waiting room waits in
// asynq's retry set (sent back by its handler) or scheduled set (enqueued
// to wait), not in a worker slot. When its turn comes (a cap's room lets
// its token out as a place frees; a rate limit's room when its tokens are
// due), the task is moved to the dequeuing end of its queue (asynqx.Wake),
// so that it runs before the tasks that came after it, or, in a worker
// with a slot free, straight into that slot (asynqx.ServerClient.Claim:
// one call instead of the move and a dequeue), and a cap's place
// waits for it (a second, renewed each time the room lets it out again
// while it is still on its way). Only a task that still waits for that
// limit is moved: never one that completed, failed, was archived or
// deleted, or waits for another key meanwhile; such a token is dismissed
// and its place (or a rate limit's hand-out) goes to the next. A task run
// by hand waits pending with its place. A task of a paused queue steps
// aside: it holds no place and spends no hand-out while its queue is
// paused, and keeps its arrival for when it resumes. A token whose task
// is still in a worker's hands after 200 ms steps aside too (a cap's is
// asked for once more a second later, see bringCap). Both rooms' wake-ups
// go through Waker.bring. Its delay in asynq is only the safety net.

// Waker brings the tasks a cap's room lets out to their queue: give its
// OnWake to semaphore.Options.OnWake. The worker and the producer's Gate
// each have one.
type Waker struct {
	rdb    redis.UniversalClient
	sem    *semaphore.Service   // set once the Service exists (it takes OnWake)
	server *asynqx.ServerClient // the worker's, which claims a task for a slot it frees; nil in a producer
	log    *slog.Logger
}

// NewWaker returns a Waker on rdb; call SetSemaphore once the Service
// made with its OnWake exists.
func NewWaker(rdb redis.UniversalClient, log *slog.Logger) *Waker {
	if log == nil {
		log = slog.Default()
	}
	return &Waker{rdb: rdb, log: log}
}

// SetSemaphore tells the Waker the Service it wakes for.
func (k *Waker) SetSemaphore(sem *semaphore.Service) { k.sem = sem }

// SetServer tells the Waker the worker's asynq client: a task it wakes is
// first offered to the worker's own next dequeue (asynqx.ServerClient.Claim),
// which saves the trip through its queue when a slot is free.
func (k *Waker) SetServer(server *asynqx.ServerClient) { k.server = server }

// OnWake brings the tasks of tokens let out of key's room to their queue.
func (k *Waker) OnWake(key string, tokens []string) {
	ctx, cancel := context.WithTimeout(context.Background(), storeCallTimeout)
	defer cancel()
	for _, token := range tokens {
		k.bringCap(ctx, key, token, true)
	}
}

// busyRetry is how long after a cap's token whose task was still in a
// worker's hands stepped aside its task is asked for once more.
const busyRetry = time.Second

// bringCap brings the task of a cap's token back (bring). A task still in
// a worker's hands after bringBack's 200 ms (its handler has not sent it
// back yet, or its worker died, and asynq brings it back only when its
// lease runs out) gives its place to the next token and keeps its arrival
// aside (semaphore.Service.StepAsideInTransit), so that the tasks of a
// dead worker, first in line, do not hold the standby places while the
// seats sit idle; it is asked for once more busyRetry later (again: false
// then), and comes back to its old place in line whenever it comes.
func (k *Waker) bringCap(ctx context.Context, key, token string, again bool) {
	var busy func(context.Context) error
	if again {
		busy = func(ctx context.Context) error {
			if err := k.sem.StepAsideInTransit(ctx, key, token); err != nil {
				return err
			}
			time.AfterFunc(busyRetry, func() {
				ctx, cancel := context.WithTimeout(context.Background(), storeCallTimeout)
				defer cancel()
				k.bringCap(ctx, key, token, false)
			})
			return nil
		}
	}
	k.bring(ctx, Mark(KindCap, key), token,
		func(ctx context.Context) error { return k.sem.Dismiss(ctx, key, token) },
		func(ctx context.Context) error { return k.sem.StepAside(ctx, key, token) },
		busy,
		func() bool { return k.sem.Unenrol(key, token) })
}

// bring brings the task of token back to its queue (bringBack). When the
// task does not come for it now, what the room handed it (a cap's place, a
// rate limit's hand-out) goes back: gone, when the task waits no more (it
// ran, was deleted or archived, or waits for another key), gives it to the
// next token; paused, when the task waits pending in its paused queue,
// also keeps the token's arrival for when the queue resumes; busy, when
// the task is still in a worker's hands (nil: what the room handed it
// lapses back by itself). It reports whether it gave it back. A task
// brought to its queue rather than to a slot here (any worker may take it)
// keeps what the room handed it; before it is, stay (when not nil) may
// send its token back to the room, and the task then stays where it waits
// (see bringBack). Both rooms' wake-ups go through it.
func (k *Waker) bring(ctx context.Context, mark, token string, gone, paused, busy func(context.Context) error, stay func() bool) bool {
	var err error
	res, stayed := k.bringBack(ctx, mark, token, stay)
	if stayed {
		return false
	}
	switch res {
	case asynqx.Woken:
		return false
	case asynqx.Gone:
		err = gone(ctx)
	case asynqx.Paused:
		err = paused(ctx)
	case asynqx.Busy:
		if busy == nil {
			return false
		}
		err = busy(ctx)
	default:
		return false
	}
	if err != nil {
		k.log.Warn("worker: hand back what a room gave a task that does not come for it now (it lapses by itself)", "mark", mark, "err", err)
		return false
	}
	return true
}

// bringBack moves the task of token into a slot of this worker (see
// SetServer), or else to the dequeuing end of its queue, and says what it
// found (see asynqx.Wake; mark is the start of the message it waits
// with). When no slot here takes it, stay (when not nil) is asked first
// whether it should stay where it waits instead (stayed: its token went
// back to the room). A task that is still in its handler (parking itself)
// is asked for again, 1 ms later, then 2, 4 and 8 ms apart, for 200 ms; if
// it is still there, or Redis fails, Busy: its place lapses back to the
// room, keeping its arrival.
func (k *Waker) bringBack(ctx context.Context, mark, token string, stay func() bool) (res asynqx.WakeResult, stayed bool) {
	t, err := ParseToken(token)
	if err != nil {
		return asynqx.Gone, false
	}
	if k.server != nil {
		if res, ok := k.server.Claim(t.Queue, t.ID, mark, WaitsForHeader); ok && res != asynqx.Busy {
			return res, false
		}
	}
	if stay != nil && stay() {
		stayed = true
		return
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	for pause := time.Millisecond; ; pause = min(2*pause, 8*time.Millisecond) {
		res, err := asynqx.Wake(ctx, k.rdb, t.Queue, t.ID, mark, WaitsForHeader)
		if err != nil {
			k.log.Warn("worker: wake a parked task (it comes back by itself)", "queue", t.Queue, "id", t.ID, "err", err)
			return asynqx.Busy, false
		}
		if res != asynqx.Busy || time.Now().After(deadline) {
			return res, false
		}
		select {
		case <-ctx.Done():
			return asynqx.Busy, false
		case <-time.After(pause):
		}
	}
}

// rateWakes runs, for each rate limit whose room this process parked tasks
// in (or, for a plain key, found tasks in: see Sweep), one loop that
// brings them back as their tokens come due.
type rateWakes struct {
	wg sync.WaitGroup // the loops and the wake-ups they started
	mu sync.Mutex
	// stopped: Admitter.Wait was called, and no loop starts any more.
	stopped bool
	running map[string]*rateLoop // by key
}

// rateLoop is what a running loop is told.
type rateLoop struct {
	// again: a task parked since the loop last found the room empty; a
	// loop ends only when it is false, so that no parked task is left
	// unwatched.
	again bool
	// nudge wakes the loop from its wait when a task parks in an empty
	// room (the loop may be waiting a semaphore.DutyLease out while the duty's
	// holder, finding the room empty, gave the duty up), or when a task
	// it handed a token out to did not come for it (see bring).
	nudge chan struct{}
}

// watch starts the loop of r's key, or tells the running one that a task
// parked; first says that it parked in an empty room.
func (rw *rateWakes) watch(a *Admitter, r Limit, first bool) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if l, runs := rw.running[r.Key]; runs {
		l.again = true
		if first {
			l.wake()
		}
		return
	}
	if a.runCtx == nil || rw.stopped {
		return
	}
	if rw.running == nil {
		rw.running = map[string]*rateLoop{}
	}
	l := &rateLoop{nudge: make(chan struct{}, 1)}
	rw.running[r.Key] = l
	rw.wg.Add(1)
	go func() {
		defer rw.wg.Done()
		rw.loop(a, r, l)
	}()
}

// done ends the loop of key unless a task parked since it found the room
// empty; then it reports false, and the loop goes on.
func (rw *rateWakes) done(key string) bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if l := rw.running[key]; l.again {
		l.again = false
		return false
	}
	delete(rw.running, key)
	return true
}

// wake nudges the loop l out of its wait, to look at its room at once.
func (l *rateLoop) wake() {
	select {
	case l.nudge <- struct{}{}:
	default: // nudged already
	}
}

// loop brings back the tasks of r's room, one a token, until it is empty
// or the worker stops. Between two asks it sleeps until the next hand-out
// may be due, as the room says, also right after a hand-out: asking at
// once would only hear that; a nudge ends the wait.
func (rw *rateWakes) loop(a *Admitter, r Limit, l *rateLoop) {
	ctx := a.runCtx
	defer func() {
		if ctx.Err() != nil { // the worker stops: nothing is watched any more
			rw.mu.Lock()
			delete(rw.running, r.Key)
			rw.mu.Unlock()
		}
	}()
	mark := Mark(KindRate, r.Key)
	pace := &roomPace{rooms: a.paced, lim: a.Limiter, enqueueOnly: a.EnqueueOnly}
	for ctx.Err() == nil {
		limit := r.Resized(a.Sizes).Rate
		gap := paceGap(limit, r.Spec.Rate.Cost)
		h, wait, err := pace.next(ctx, r.Key, limit, r.Spec.Rate.Cost)
		switch {
		case errors.Is(err, semaphore.ErrRoomEmpty):
			if rw.done(r.Key) {
				return
			}
			continue
		case err != nil:
			if ctx.Err() == nil {
				a.Logger.Warn("worker: bring back tasks that waited for tokens (they come back by themselves)", "key", r.Key, "err", err)
			}
			wait = time.Second
		case h.Token != "":
			rw.wg.Add(1)
			go func() {
				defer rw.wg.Done()
				bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
				defer cancel()
				// A hand-out given back does not count against the pace: the
				// next comes one interval of the tokens sooner.
				gone := func(ctx context.Context) error { return a.paced.Void(ctx, r.Key, gap) }
				aside := func(ctx context.Context) error { return a.paced.StepAside(ctx, r.Key, h, gap, 3*a.ParkedRetry) }
				// A task still in a worker's hands (its worker died, say)
				// steps aside as one of a paused queue does: the hand-out
				// goes to the next token, and the task takes its old place
				// in line when it comes back.
				if a.Waker.bring(bctx, mark, h.Token, gone, aside, aside, nil) {
					l.wake()
				}
			}()
			if wait < time.Millisecond {
				continue
			}
		}
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-t.C:
		case <-l.nudge:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// roomPace hands out the tokens of a rate limit's room (a paced room of
// package semaphore) for one process, at the limit's pace, in arrival
// order, fleet-wide: however many processes ask, at most one token an
// interval of the limit's cost goes out. Of the processes that ask, one
// at a time holds the duty of a room (semaphore.DutyLease, renewed as it
// asks, and given up once the room is empty): only it looks at the
// tokens; the others are told to ask again after DutyLease, and one of
// them takes the duty over once the holder stops asking (it stopped, or
// died); a worker takes it over from a producer at once.
type roomPace struct {
	rooms       *semaphore.PacedRooms
	lim         *ratelimit.Limiter
	enqueueOnly bool      // a producer's: it asks for the duty every time (a worker may have taken it over)
	dutyAt      time.Time // when this process last took or renewed the duty; zero: it does not hold it
}

// next hands out the first token of key's room once cost tokens of the
// limit are due, or hands out nothing (Handout.Token ""); either way wait
// is how long until the next hand-out may be due, the time to ask again.
// While another process holds the room's duty it hands out nothing and
// says semaphore.DutyLease. It returns semaphore.ErrRoomEmpty when no token
// waits.
func (p *roomPace) next(ctx context.Context, key string, limit ratelimit.Limit, cost int) (h semaphore.Handout, wait time.Duration, err error) {
	// The duty is asked for first, unless taken within half a lease; then
	// only when the tokens are not due (the pop says when the room is
	// empty), so that handing out costs no call more.
	checked := p.enqueueOnly || p.dutyAt.IsZero() || time.Since(p.dutyAt) >= semaphore.DutyLease/2
	if checked {
		if wait, err := p.duty(ctx, key); err != nil || wait > 0 {
			return semaphore.Handout{}, wait, err
		}
	}
	peek, err := p.lim.Peek(ctx, key, limit, cost)
	if err != nil {
		return semaphore.Handout{}, 0, err
	}
	if !peek.Allowed {
		if !checked {
			if wait, err := p.duty(ctx, key); err != nil || wait > 0 {
				return semaphore.Handout{}, wait, err
			}
		}
		return semaphore.Handout{}, peek.RetryAfter, nil
	}
	h, wait, err = p.rooms.Pop(ctx, key, paceGap(limit, cost))
	if err != nil {
		p.dutyAt = time.Time{}
	}
	return h, wait, err
}

// duty takes or renews the duty of key's room: 0 on duty, DutyLease (the
// wait before asking again) when another process holds it,
// semaphore.ErrRoomEmpty when nobody waits.
func (p *roomPace) duty(ctx context.Context, key string) (time.Duration, error) {
	onDuty, err := p.rooms.Duty(ctx, key)
	if err != nil || !onDuty {
		p.dutyAt = time.Time{}
		if err != nil {
			return 0, err
		}
		return semaphore.DutyLease, nil
	}
	p.dutyAt = time.Now()
	return 0, nil
}

// paceGap is the interval a limit earns cost tokens in: the time between
// two hand-outs of its room.
func paceGap(limit ratelimit.Limit, cost int) time.Duration {
	return time.Duration(float64(cost) * float64(limit.Interval()))
}
