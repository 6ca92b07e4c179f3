package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/internal/lately"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// The path of a task, from the slot asynq gave it to its handler or back to
// its queue (Admit, then Admission.Run):
//  1. render its limits: its caps, then its rate limits, keys rendered
//     from the payload, sizes in force (Table.For);
//  2. enter: ask each cap for a seat in turn (semaphore.Enter); a cap with
//     none gives the task a standby place, fleet-wide within the cap's
//     standby budget, or parks it in the cap's waiting room;
//  3. stand by: with a place, wait in this slot for the next seat, up to
//     the cap's wait_timeout, holding no seat meanwhile; once at most;
//  4. take the tokens of its rate limits, holding its seats: a limit with
//     none gives the seats back, and the task sleeps until its tokens are
//     due (mode wait, within wait_timeout) or is parked in the limit's room;
//  5. run holding every seat, then release them (Admission.Run);
//  6. or go back (a Back): the task returns to asynq without a failure,
//     parked in the room of the limit that held it back, keeping its
//     arrival in the rooms of the others (it steps aside there), to be
//     brought back when its turn comes (wake.go).
// No seat is held while the task waits for another, so stacked caps never
// deadlock and no seat idles behind a blocked one.

// Observer receives what the admission path reports beside the
// semaphore's own events; monitoring.Metrics implements it.
type Observer interface {
	semaphore.Observer
	// Requeued is called when a task goes back to its queue without
	// running; why is one of the Reasons.
	Requeued(key, taskType, why string)
	// LeaseLost is called when a running task's seat is lost.
	LeaseLost(key, taskType string)
	// Waiting is called with +1 when a task of a cap of key takes a worker
	// slot and asks for its seat, and with -1 when it runs or goes back: it
	// counts the slots that hold a capped task which is not running. A task
	// that runs is counted out before its standby place goes to the next.
	Waiting(key string, delta int)
}

// Options configure an Admitter.
type Options struct {
	Redis       redis.UniversalClient // what Semaphore and Limiter use
	Table       *Table
	Semaphore   *semaphore.Service
	Limiter     *ratelimit.Limiter
	Sizes       Sizes // the operators' overrides; nil: the config's
	Observer    Observer
	Logger      *slog.Logger
	ParkedRetry time.Duration // worker.parked_retry: how long the rooms keep a token
	// EnqueueOnly says that this Admitter's process does not run the
	// tasks it brings back from the rate limits' rooms (a producer's Gate):
	// it hands a room's tokens out only while a worker asked for the
	// room's duty lately, and gives the duty up to one (see roomPace).
	EnqueueOnly bool
	// Waker is the worker's (its Semaphore's OnWake): the tasks a rate
	// limit's room hands out are brought back through it too, so that a
	// worker's own next dequeue is offered them first (see
	// Waker.SetServer). Nil: a Waker of its own on Redis, without.
	Waker *Waker
}

// Admitter takes the limits of the tasks of one worker process. It is safe
// for concurrent use.
type Admitter struct {
	Options
	rateObs ratelimit.Observer
	paced   *semaphore.PacedRooms // the rate limits' rooms

	full  fullHints
	rooms roomKeys // rendered keys whose rooms this process parked tasks in
	// sweptElsewhere are the rooms another process swept lately: this
	// one leaves them alone for a while (see Sweep).
	sweptElsewhere lately.Marks
	recentCaps     *recentKeys // rendered cap keys, for monitoring
	recentRates    *recentKeys // rendered rate-limit keys, for monitoring
	rateWakes      rateWakes
	// notedSince is the time (Unix ms) of the latest noted room of a
	// rendered rate-limit key this process's sweep found (see Sweep).
	notedSince atomic.Int64

	runCtx context.Context // the serving worker's (Start): the rate rooms' loops end with it
}

// New returns an Admitter.
func New(opts Options) (*Admitter, error) {
	if opts.Redis == nil || opts.Table == nil || opts.Semaphore == nil || opts.Limiter == nil {
		return nil, errors.New("admission: New wants a Redis client, a Table, a Semaphore and a Limiter")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Waker == nil {
		opts.Waker = NewWaker(opts.Redis, opts.Logger)
	}
	a := &Admitter{Options: opts, full: newFullHints(), recentCaps: newRecentKeys(), recentRates: newRecentKeys(),
		sweptElsewhere: lately.Marks{For: leaveSwept, Max: 2 * roomKeysMax}} // the plain keys, and the rendered ones (roomKeys)
	a.rateObs, _ = opts.Observer.(ratelimit.Observer)
	a.paced = opts.Semaphore.PacedRooms(opts.EnqueueOnly)
	return a, nil
}

// Start lets the Admitter bring back tasks parked for tokens until ctx is
// done (the worker serves); call it before the first task.
func (a *Admitter) Start(ctx context.Context) { a.runCtx = ctx }

// Wait returns once the loops that bring back tasks parked for tokens have
// ended, with the wake-ups they started; they end when Start's ctx is done.
func (a *Admitter) Wait() {
	a.rateWakes.mu.Lock()
	a.rateWakes.stopped = true
	a.rateWakes.mu.Unlock()
	a.rateWakes.wg.Wait()
}

// heldSeat is a seat a task holds while it runs.
type heldSeat struct {
	Limit
	permit *semaphore.Permit
	entry  *semaphore.Entry // its standby place, held until the task starts (see settle)
}

// Admission is a task admitted past its limits: it holds a seat of each
// cap and spent the tokens of each rate limit. Run it.
type Admission struct {
	a        *Admitter
	taskType string
	held     []heldSeat
}

// TokenOf is the token of the task of a handler's context.
func TokenOf(ctx context.Context) Token {
	queue, _ := asynq.GetQueueName(ctx)
	id, _ := asynq.GetTaskID(ctx)
	return Token{Queue: queue, ID: id}
}

// Admit takes the limits of task t of taskType, which asynq gave this
// process: an Admission to run it with, or the Back that sends it to its
// queue without a failure. A payload that cannot render one of its keys is
// an error wrapping asynq.SkipRetry: the task must never run without its
// limits.
func (a *Admitter) Admit(ctx context.Context, taskType string, t *asynq.Task) (*Admission, *Back, error) {
	caps, rates, err := a.limitsFor(taskType, t.Payload())
	if err != nil {
		return nil, nil, fmt.Errorf("worker: task %s not run: %w: %w", taskType, err, asynq.SkipRetry)
	}
	a.waiting(caps, +1)
	held, back := a.take(ctx, caps, rates, TokenOf(ctx).String())
	a.waiting(caps, -1)
	if back != nil {
		return nil, back, nil
	}
	// It starts: its standby places go to the next tokens, without making
	// it wait for that. (A task that took its seats at once holds none.)
	if slices.ContainsFunc(held, func(hs heldSeat) bool { return hs.entry != nil && hs.entry.HoldsPlace() }) {
		go a.settle(ctx, slices.Clone(held))
	}
	return &Admission{a: a, taskType: taskType, held: held}, nil, nil
}

// limitsFor renders the caps and the rate limits of a task (Table.For),
// and remembers the rendered keys for monitoring.
func (a *Admitter) limitsFor(taskType string, payload []byte) (caps, rates []Limit, err error) {
	limits, err := a.Table.For(taskType, payload, a.Sizes)
	if err != nil {
		return nil, nil, err
	}
	// For gives the caps first, then the rate limits: the two are parts of
	// its slice, not copies.
	n := 0
	for _, l := range limits {
		switch l.Kind {
		case KindCap:
			if l.Template != "" {
				a.recentCaps.touch(l.Key, l.Template, l.Capacity)
			}
			n++
		case KindRate:
			if l.Template != "" {
				a.recentRates.touch(l.Key, l.Template, 0)
			}
		}
	}
	if n > 0 {
		caps = limits[:n:n]
	}
	if n < len(limits) {
		rates = limits[n:]
	}
	return caps, rates, nil
}

// waiting reports to the observer that the task holds a slot without
// running, for each of its caps (+1), or no longer (-1). The -1 of a task
// that starts comes before its standby places go to the next tasks (see
// settle), so that a count of it never overlaps theirs.
func (a *Admitter) waiting(caps []Limit, delta int) {
	if a.Observer != nil {
		for _, l := range caps {
			a.Observer.Waiting(l.Key, delta)
		}
	}
}

// take takes the task's seats, then its tokens. Without tokens it gives the
// seats back, and waits for the tokens (mode wait, within wait_timeout) or
// goes back parked in the rate limit's room.
func (a *Admitter) take(ctx context.Context, caps, rates []Limit, token string) ([]heldSeat, *Back) {
	var waitUntil time.Time
	for {
		held, back := a.takeSeats(ctx, caps, token, len(caps) == 1 && len(rates) == 0)
		if back != nil {
			if back.Parked {
				a.stepAsideElsewhere(ctx, caps, back.Key, token)
			}
			return nil, back
		}
		if len(rates) == 0 {
			return held, nil
		}
		limited, due, err := a.takeTokens(ctx, rates)
		if err == nil && limited == nil {
			return held, nil
		}
		a.giveBack(ctx, held)
		if err != nil {
			return nil, &Back{Key: rates[0].Key, Kind: KindRate, Why: ReasonStoreError, Err: err}
		}
		if limited.Spec.Rate.Mode == config.ModeWait {
			if waitUntil.IsZero() {
				waitUntil = time.Now().Add(limited.Spec.Rate.WaitTimeout)
			}
			if waitForTokens(ctx, due, waitUntil) {
				continue
			}
		}
		return nil, a.parkForTokens(ctx, *limited, token)
	}
}

// takeSeats takes a seat of every cap of the task. It never holds a seat
// while it waits: when a cap has none it gives back what it took, then
// stands by for that cap once, or goes back to its queue parked in the
// cap's waiting room.
//
// A task with one cap and no rate limit (alone) starts as its seat comes
// (semaphore.WithStartOnSeat).
func (a *Admitter) takeSeats(ctx context.Context, caps []Limit, token string, alone bool) ([]heldSeat, *Back) {
	taken := make([]heldSeat, len(caps))
	for i := range caps {
		taken[i].Limit = caps[i]
	}
	stoodBy := false
	for {
		stop := a.enterAll(ctx, taken, token, alone)
		if stop == nil {
			return taken, nil
		}
		i, entry := stop.i, stop.entry
		notAsked := unentered(taken, i)
		a.giveBack(ctx, taken)
		switch {
		case stop.back != nil:
			return nil, stop.back
		case !entry.Standby:
			a.rooms.note(&caps[i])
			return nil, &Back{Key: caps[i].Key, Kind: KindCap, Why: ReasonFull, Parked: true}
		case stoodBy:
			// It stood by for another cap already: no second wait.
			if err := entry.Park(ctx); err != nil {
				a.Logger.Warn("worker: park a task (its place lapses by itself)", "key", caps[i].Key, "err", err)
			}
			a.rooms.note(&caps[i])
			return nil, &Back{Key: caps[i].Key, Kind: KindCap, Why: ReasonTimeout, Parked: true}
		}
		stoodBy = true
		// A producer may have kept it a place on the caps it has not
		// entered: it waits for this one, so those places go to others.
		a.stepAsideElsewhere(ctx, notAsked, caps[i].Key, token)
		p, back := a.standBy(ctx, &caps[i], entry, token)
		if back != nil {
			return nil, back
		}
		taken[i].permit, taken[i].entry = p, entry
	}
}

// unentered are the caps of taken, other than the i-th, that the task has
// not asked for a seat yet (enterAll stopped at the i-th).
func unentered(taken []heldSeat, i int) []Limit {
	var caps []Limit
	for j, hs := range taken {
		if j != i && hs.permit == nil && hs.entry == nil {
			caps = append(caps, hs.Limit)
		}
	}
	return caps
}

// stepAsideElsewhere steps the token of a task that waits for key (parked
// in its room, or standing by for it) aside in the rooms of caps other
// than key: a place it held there (it was let out for that cap, or a
// producer kept it one) goes to the next token of that cap, instead of
// waiting for a task that waits elsewhere, and its arrival there is kept
// for when it comes back.
func (a *Admitter) stepAsideElsewhere(ctx context.Context, caps []Limit, key, token string) {
	if !slices.ContainsFunc(caps, func(l Limit) bool { return l.Key != key }) {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
	defer cancel()
	for _, l := range caps {
		if l.Key == key {
			continue
		}
		if err := a.Semaphore.StepAside(dctx, l.Key, token); err != nil {
			a.Logger.Warn("worker: leave a waiting room (its place lapses by itself)", "key", l.Key, "err", err)
		}
	}
}

// stopped is where enterAll stopped: the index in taken of the cap that
// had no seat for the task, and what it gave (a standby place, or a parked
// token), or the Back of a call that failed.
type stopped struct {
	i     int
	entry *semaphore.Entry
	back  *Back
}

// enterAll asks each cap not held yet for a seat, the caps found full
// lately first (see fullHints). It returns where it stopped, or nil when
// every seat is held.
func (a *Admitter) enterAll(ctx context.Context, taken []heldSeat, token string, alone bool) *stopped {
	for _, i := range a.full.order(taken) {
		if taken[i].permit != nil {
			continue
		}
		l := &taken[i].Limit
		permits := l.Capacity
		if l.Seats > permits {
			// An operator lowered the capacity below the task's cost: it
			// waits as on a paused key, holding nothing back, until the
			// capacity is raised again.
			permits = 0
		}
		opts := a.permitOptions(ctx, l)
		if alone {
			opts = append(opts, semaphore.WithStartOnSeat())
		}
		e, err := a.Semaphore.Enter(ctx, l.Key, permits, token, a.room(l), opts...)
		if err != nil {
			return &stopped{i: i, back: a.acquireFailed(l.Key, err)}
		}
		if e.Permit == nil {
			if len(taken) > 1 {
				a.full.Mark(l.Key)
			}
			return &stopped{i: i, entry: e}
		}
		if len(taken) > 1 {
			a.full.Forget(l.Key)
		}
		taken[i].permit, taken[i].entry = e.Permit, e
	}
	return nil
}

// giveBack releases the seats taken so far, and steps aside from their
// standby places: the task does not start now, and keeps its arrival in
// each room for when it comes back.
func (a *Admitter) giveBack(ctx context.Context, taken []heldSeat) {
	for i, hs := range taken {
		if hs.permit != nil {
			a.release(ctx, hs.Key, hs.permit)
			taken[i].permit = nil
		}
		if hs.entry == nil {
			continue
		}
		taken[i].entry = nil
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
		if err := hs.entry.StepAside(sctx); err != nil {
			a.Logger.Warn("worker: give up a standby place (it lapses by itself)", "key", hs.Key, "err", err)
		}
		cancel()
	}
}

// settle gives up the standby places the task's seats still hold (see
// semaphore.Entry.Settle): the task starts.
func (a *Admitter) settle(ctx context.Context, held []heldSeat) {
	for _, hs := range held {
		if hs.entry == nil {
			continue
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
		if err := hs.entry.Settle(sctx); err != nil {
			a.Logger.Warn("worker: give up a standby place (it lapses by itself)", "key", hs.Key, "err", err)
		}
		cancel()
	}
}

// standBy waits in this slot, with the standby place entry gave, for the
// next seat of l, up to its wait_timeout. A wait that ends without a seat
// goes back to the room, keeping the task's place (Entry.Wait parks it).
func (a *Admitter) standBy(ctx context.Context, l *Limit, entry *semaphore.Entry, token string) (*semaphore.Permit, *Back) {
	p, err := entry.Wait(ctx, semaphore.WithWaitTimeout(l.Cap.WaitTimeout))
	if err == nil {
		return p, nil
	}
	back := a.acquireFailed(l.Key, err)
	if back.Parked {
		back.Err = nil // its message says why: (timeout), (shutdown)
		a.rooms.note(l)
	}
	return nil, back
}

// permitOptions are the options of a seat taken for the task of ctx: its
// ID labels the seat, it takes the task's cost in seats, and it waits in
// its fair share's line.
func (a *Admitter) permitOptions(ctx context.Context, l *Limit) []semaphore.AcquireOption {
	taskID, _ := asynq.GetTaskID(ctx)
	opts := append([]semaphore.AcquireOption{semaphore.WithTTL(l.Cap.TTL), semaphore.WithHolder(taskID), semaphore.WithWeight(max(l.Seats, 1))}, l.lineOptions()...)
	if l.Cap.AutoRenewEnabled() {
		opts = append(opts, semaphore.WithAutoRenew())
	}
	return opts
}

// acquireFailed turns a failed Enter or standby wait into a Back: parked
// (in the cap's room) unless the store failed or asynq ends the task.
func (a *Admitter) acquireFailed(key string, err error) *Back {
	why := ReasonStoreError
	var aerr *semaphore.AcquisitionError
	if errors.As(err, &aerr) {
		switch aerr.Reason {
		case semaphore.ReasonTimeout, semaphore.ReasonExhausted:
			why = ReasonTimeout
		case semaphore.ReasonShutdown:
			why = ReasonShutdown
		case semaphore.ReasonCanceled:
			why = ReasonCanceled
		}
	}
	return &Back{Key: key, Kind: KindCap, Why: why, Parked: why != ReasonStoreError && why != ReasonCanceled, Err: err}
}

// release gives a seat back. (The release itself lets the next tasks out
// of the key's waiting room.)
func (a *Admitter) release(ctx context.Context, key string, p *semaphore.Permit) {
	err := p.Release(context.WithoutCancel(ctx))
	switch {
	case errors.Is(err, semaphore.ErrPermitNotHeld):
		a.Logger.Warn("worker: the seat was lost before the task ended: the cap was not held for the whole run; raise the cap's ttl or turn on auto_renew",
			"key", key, "permit", p.ID())
	case err != nil:
		a.Logger.Warn("worker: release a seat (it lapses with its lease)", "key", key, "err", err)
	}
}

// takeTokens takes the tokens of every rate limit of a task, or none: it
// peeks at all first, so that a limit with no token spends nobody's, and
// gives back what it took when a take fails after its peek. One limit alone
// is not peeked at: a take that is refused spends nothing. It returns the
// first limit with no token and how long until its tokens are due, or nil
// when the task may run.
func (a *Admitter) takeTokens(ctx context.Context, rates []Limit) (*Limit, time.Duration, error) {
	peeks := rates
	if len(rates) == 1 {
		peeks = nil
	}
	for i, r := range peeks {
		res, err := a.Limiter.Peek(ctx, r.Key, r.Rate, r.Spec.Rate.Cost)
		if err != nil {
			return nil, 0, err
		}
		if !res.Allowed {
			// A refusal found by the peek is a limited take for the
			// metrics (the page's own peeks are not).
			if a.rateObs != nil {
				a.rateObs.Take(ratelimit.TakeEvent{Key: r.Key, Cost: r.Spec.Rate.Cost, Remaining: res.Remaining, RetryAfter: res.RetryAfter})
			}
			return &rates[i], res.RetryAfter, nil
		}
	}
	for i, r := range rates {
		res, err := a.Limiter.Take(ctx, r.Key, r.Rate, r.Spec.Rate.Cost)
		if err == nil && res.Allowed {
			continue
		}
		// Another task took them since the peek (or Redis failed): the
		// task does not run, so the tokens it took of the limits before
		// this one go back.
		a.refund(ctx, rates[:i])
		if err != nil {
			return nil, 0, err
		}
		return &rates[i], res.RetryAfter, nil
	}
	return nil, 0, nil
}

// refund gives back the tokens taken of rates by a task that does not run.
func (a *Admitter) refund(ctx context.Context, rates []Limit) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
	defer cancel()
	for _, r := range rates {
		if err := a.Limiter.Refund(rctx, r.Key, r.Rate, r.Spec.Rate.Cost); err != nil {
			a.Logger.Warn("worker: give back the tokens of a task that does not run (they are spent)", "key", r.Key, "err", err)
		}
	}
}

// waitForTokens sleeps until a rate limit's tokens are due (mode wait): it
// reports false when they are not due within the wait left before
// deadline, or ctx ended.
func waitForTokens(ctx context.Context, due time.Duration, deadline time.Time) bool {
	if time.Now().Add(due).After(deadline) {
		return false
	}
	t := time.NewTimer(due)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// parkForTokens parks the task of token in the room of r (parkToken).
func (a *Admitter) parkForTokens(ctx context.Context, r Limit, token string) *Back {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
	defer cancel()
	if _, err := a.parkToken(pctx, r, token, false); err != nil {
		taskID, _ := asynq.GetTaskID(ctx)
		a.Logger.Warn("worker: park a task for tokens (it comes back after its delay)", "key", r.Key, "id", taskID, "err", err)
	}
	return &Back{Key: r.Key, Kind: KindRate, Why: ReasonRateLimited, Parked: true}
}

// parkToken puts token in the room of rate limit r, and makes sure this
// process brings tasks back from it when their tokens are due, even when
// the park failed (the room may hold others). It returns how many tokens
// wait in the room. A fresh token was made for a task just enqueued: it
// cannot have stepped aside (see rateReturn).
func (a *Admitter) parkToken(ctx context.Context, r Limit, token string, fresh bool) (int, error) {
	n, err := a.paced.Park(ctx, r.Key, token, 3*a.ParkedRetry, fresh)
	a.rateWakes.watch(a, r, err == nil && n == 1)
	if err == nil && n == 1 && r.Template != "" {
		a.noteRenderedRoom(ctx, r)
	}
	return n, err
}

// noteRenderedRoom notes the room of l, a limit whose key is rendered from
// a template, as the first task waits in it
// (semaphore.Service.NoteRenderedRoom; not the room scripts' noteRoom,
// which renews a cap room's settings): workers that never parked in it
// learn of it from the note (see Sweep), and bring its tasks back.
func (a *Admitter) noteRenderedRoom(ctx context.Context, l Limit) {
	if err := a.Semaphore.NoteRenderedRoom(ctx, l.Template, l.Key, 3*a.ParkedRetry); err != nil {
		a.Logger.Warn("worker: note a waiting room for the workers (its tasks come back after their delay)", "key", l.Key, "err", err)
	}
}

// Run runs h holding the task's seats, and releases them after. A task
// whose seat is lost while it runs has its context cancelled (on_lease_lost:
// cancel; the default) and goes back with a Back when its handler then
// fails, or is only logged (continue).
func (adm *Admission) Run(ctx context.Context, h asynq.Handler, t *asynq.Task) (*Back, error) {
	a := adm.a
	for _, hs := range adm.held {
		if hs.Template != "" {
			a.recentCaps.hold(hs.Key, hs.Template, hs.Capacity, 1) // listed for monitoring while held
		}
	}
	hctx, cancel := context.WithCancelCause(withFences(ctx, adm.held))
	defer cancel(nil)
	var lostMu sync.Mutex
	var lostKey string
	// onLost runs only when a seat is lost: nothing waits while it is held.
	var onLost sync.WaitGroup
	stops := make([]func() bool, len(adm.held))
	for i, hs := range adm.held {
		onLost.Add(1)
		stops[i] = hs.permit.AfterLost(func() {
			defer onLost.Done()
			lostMu.Lock()
			lostKey = hs.Key
			lostMu.Unlock()
			if a.Observer != nil {
				a.Observer.LeaseLost(hs.Key, adm.taskType)
			}
			taskID, _ := asynq.GetTaskID(ctx)
			if hs.Cap.OnLeaseLost == config.LeaseLostContinue {
				a.Logger.Warn("worker: lease lost; the task goes on (on_lease_lost: continue)", "key", hs.Key, "type", adm.taskType, "id", taskID)
				return
			}
			a.Logger.Warn("worker: lease lost; cancelling the task", "key", hs.Key, "type", adm.taskType, "id", taskID)
			cancel(fmt.Errorf("fleetcap: lease of %q lost", hs.Key))
		})
	}
	err := h.ProcessTask(hctx, t)
	for _, stop := range stops {
		if stop() {
			onLost.Done()
		}
	}
	onLost.Wait()
	for _, hs := range adm.held {
		a.release(ctx, hs.Key, hs.permit)
		if hs.Template != "" {
			a.recentCaps.hold(hs.Key, hs.Template, hs.Capacity, -1)
		}
	}
	lostMu.Lock()
	lost := lostKey
	lostMu.Unlock()
	if err != nil && lost != "" && context.Cause(hctx) != nil && ctx.Err() == nil {
		// The task was stopped because its seat was lost, not because it
		// failed: run it again once it has a seat.
		return &Back{Key: lost, Kind: KindCap, Why: ReasonLeaseLost, Err: err}, nil
	}
	return nil, err
}

// storeCallTimeout bounds one call made on a task's behalf after its
// context may be done.
const storeCallTimeout = 5 * time.Second

// Full hints. A task with several caps first tries the ones this process
// found full within fullHintFor, so that while one tenant's cap is full its
// tasks go back without taking (and giving back) a seat of the shared cap
// first. The hints stay few: a key leaves when a seat of it is taken, and
// old ones are dropped when there are more than fullHintMax.
const (
	fullHintFor = time.Second
	fullHintMax = 1024
)

// fullHints remembers which keys this process found full lately.
type fullHints struct{ *lately.Marks }

func newFullHints() fullHints {
	return fullHints{&lately.Marks{For: fullHintFor, Max: fullHintMax}}
}

// order is the order in which a task tries its seats: the ones hinted full
// first, then the others, each group in key order. The order only saves
// work: no seat is ever held while waiting, so any order is free of
// deadlock; waiting itself is for one seat at a time.
func (h fullHints) order(seats []heldSeat) []int {
	order := make([]int, 0, len(seats))
	if len(seats) > 1 {
		for i, s := range seats {
			if h.Recent(s.Key) {
				order = append(order, i)
			}
		}
	}
	for i := range seats {
		if !slices.Contains(order, i) {
			order = append(order, i)
		}
	}
	return order
}
