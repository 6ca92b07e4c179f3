package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/semaphore"
)

// The cap middleware. A capped task's path:
//  1. render its seats (one per cap, keys rendered, capacities in force);
//  2. enter: ask each cap for a seat in turn (semaphore.Enter); a cap with
//     none gives the task a standby place, fleet-wide within the cap's
//     standby budget, or parks it in the cap's waiting room;
//  3. stand by: with a place, wait in this slot for the next seat, up to
//     the cap's wait_timeout; holding no seat meanwhile;
//  4. run holding every seat, then release them;
//  5. or go back: without a seat, the task returns to asynq without a
//     failure (see requeue.go), parked in the room of the cap that had
//     none, to be brought back when a place frees (see wake.go).

// heldSeat is a seat a task holds while it runs.
type heldSeat struct {
	seat
	permit *semaphore.Permit
	entry  *semaphore.Entry // its standby place, held until the task starts (see settle)
}

// capped wraps h in the caps and rate limits of taskType, if it has any.
func (w *Worker) capped(taskType string, h asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		specs, rateSpecs := w.caps.byType[taskType], w.rates[taskType]
		if len(specs) == 0 && len(rateSpecs) == 0 {
			return h.ProcessTask(ctx, t)
		}
		seats, err := w.seatsFor(specs, t)
		if err != nil {
			// Never run a task without its cap: its payload is broken.
			return fmt.Errorf("worker: task %s not run: its payload cannot render its semaphore key: %w: %w", taskType, err, asynq.SkipRetry)
		}
		rates, err := w.ratesFor(rateSpecs, t.Payload())
		if err != nil {
			return fmt.Errorf("worker: task %s not run: its payload cannot render its rate limit key: %w: %w", taskType, err, asynq.SkipRetry)
		}
		w.waiting(seats, +1)
		held, rq := w.takeSeatsAndTokens(ctx, seats, rates, waitToken(ctx))
		w.waiting(seats, -1)
		if rq != nil {
			return w.requeue(ctx, taskType, t, rq)
		}
		// It starts: its standby places go to the next tokens, without
		// making it wait for that.
		go w.settle(ctx, slices.Clone(held))
		return w.runHolding(ctx, taskType, t, h, held)
	})
}

// waiting reports to the observer that the task holds a slot without
// running, for each of its seats (+1), or no longer (-1). The -1 of a task
// that starts comes before its standby places go to the next tasks (see
// settle), so that a count of it never overlaps theirs.
func (w *Worker) waiting(seats []seat, delta int) {
	if obs := w.opts.observer; obs != nil {
		for _, s := range seats {
			obs.Waiting(s.key, delta)
		}
	}
}

// takeSeatsAndTokens takes the task's seats, then its tokens. Without
// tokens it gives the seats back, and waits for the tokens (mode wait,
// within wait_timeout) or goes back parked in the rate limit's room.
func (w *Worker) takeSeatsAndTokens(ctx context.Context, seats []seat, rates []rateTake, token string) ([]heldSeat, *requeueRequest) {
	var waitUntil time.Time
	for {
		held, rq := w.takeSeats(ctx, seats, token)
		if rq != nil {
			if rq.parked() {
				w.leaveOtherRooms(ctx, seats, rq.key, token)
			}
			return nil, rq
		}
		if len(rates) == 0 {
			return held, nil
		}
		limited, due, err := w.takeTokens(ctx, rates)
		if err == nil && limited == nil {
			return held, nil
		}
		w.giveBack(ctx, held)
		if err != nil {
			return nil, &requeueRequest{key: rates[0].key, why: RequeueStoreError, err: err}
		}
		if limited.spec.Mode == config.ModeWait {
			if waitUntil.IsZero() {
				waitUntil = time.Now().Add(limited.spec.WaitTimeout)
			}
			if waitForTokens(ctx, due, waitUntil) {
				continue
			}
		}
		return nil, w.parkForTokens(ctx, limited, token)
	}
}

// waitToken is a task's token in the waiting rooms of its caps: its queue
// and ID.
func waitToken(ctx context.Context) string {
	queue, _ := asynq.GetQueueName(ctx)
	id, _ := asynq.GetTaskID(ctx)
	return queue + "\x00" + id
}

// noRetryLeft reports whether asynq would archive the task on any error.
func noRetryLeft(ctx context.Context) bool {
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	return retried >= maxRetry
}

// takeSeats takes a seat of every cap of the task. It never holds a seat
// while it waits: when a cap has none it gives back what it took, then
// stands by for that cap once, or goes back to its queue parked in the
// cap's waiting room.
func (w *Worker) takeSeats(ctx context.Context, seats []seat, token string) ([]heldSeat, *requeueRequest) {
	taken := make([]heldSeat, len(seats))
	for i, s := range seats {
		taken[i].seat = s
	}
	stoodBy := false
	for {
		i, entry, rq := w.enterAll(ctx, taken, token)
		if rq == nil && i < 0 {
			return taken, nil
		}
		w.giveBack(ctx, taken)
		switch {
		case rq != nil:
			return nil, rq
		case !entry.Standby:
			w.rooms.note(seats[i])
			return nil, &requeueRequest{key: seats[i].key, why: RequeueFull, token: token}
		case stoodBy:
			// It stood by for another cap already: no second wait.
			return nil, w.parkAfterStandby(ctx, seats[i], token, RequeueTimeout)
		}
		stoodBy = true
		p, rq := w.standBy(ctx, seats[i], entry, token)
		if rq != nil {
			return nil, rq
		}
		taken[i].permit, taken[i].entry = p, entry
	}
}

// leaveOtherRooms steps the token of a task parked in the room of key
// aside in the rooms of its other caps: a standby place it held there (it
// was let out for that cap) goes to the next token of that cap, instead of
// waiting for a task that waits elsewhere, and its arrival there is kept
// for when it comes back.
func (w *Worker) leaveOtherRooms(ctx context.Context, seats []seat, key, token string) {
	if len(seats) < 2 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
	defer cancel()
	for _, s := range seats {
		if s.key == key {
			continue
		}
		if err := w.sem.StepAside(dctx, s.key, token); err != nil {
			w.log.Warn("worker: leave a waiting room (its place lapses by itself)", "key", s.key, "err", err)
		}
	}
}

// enterAll asks each cap not held yet for a seat, the caps found full
// lately first (see attemptOrder). It returns the index of the first that
// had none, and what it gave (a standby place, or a parked token), or -1
// when every seat is held.
func (w *Worker) enterAll(ctx context.Context, taken []heldSeat, token string) (int, *semaphore.Entry, *requeueRequest) {
	seats := make([]seat, len(taken))
	for i, hs := range taken {
		seats[i] = hs.seat
	}
	for _, i := range w.caps.attemptOrder(seats) {
		if taken[i].permit != nil {
			continue
		}
		s := seats[i]
		e, err := w.sem.Enter(ctx, s.key, s.capacity, token, s.room(w.cfg.Worker.ParkedRetry), w.permitOptions(ctx, s)...)
		if err != nil {
			return i, nil, w.acquireFailed(s.key, token, err)
		}
		if e.Permit == nil {
			if len(seats) > 1 {
				w.caps.markFull(s.key)
			}
			return i, e, nil
		}
		if len(seats) > 1 {
			w.caps.markFree(s.key)
		}
		taken[i].permit, taken[i].entry = e.Permit, e
	}
	return -1, nil, nil
}

// giveBack releases the seats taken so far, and steps aside from their
// standby places: the task does not start now, and keeps its arrival in
// each room for when it comes back.
func (w *Worker) giveBack(ctx context.Context, taken []heldSeat) {
	for i, hs := range taken {
		if hs.permit != nil {
			w.release(ctx, hs.key, hs.permit)
			taken[i].permit = nil
		}
		if hs.entry == nil {
			continue
		}
		taken[i].entry = nil
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
		if err := hs.entry.StepAside(sctx); err != nil {
			w.log.Warn("worker: give up a standby place (it lapses by itself)", "key", hs.key, "err", err)
		}
		cancel()
	}
}

// settle gives up the standby places the task's seats still hold (see
// semaphore.Entry.Settle): the task starts, or goes back.
func (w *Worker) settle(ctx context.Context, held []heldSeat) {
	for i, hs := range held {
		if hs.entry == nil {
			continue
		}
		held[i].entry = nil
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
		if err := hs.entry.Settle(sctx); err != nil {
			w.log.Warn("worker: give up a standby place (it lapses by itself)", "key", hs.key, "err", err)
		}
		cancel()
	}
}

// standBy waits in this slot, with the standby place entry gave, for the
// next seat of s, up to its wait_timeout. A wait that ends without a seat
// goes back to the room, keeping the task's place.
func (w *Worker) standBy(ctx context.Context, s seat, entry *semaphore.Entry, token string) (*semaphore.Permit, *requeueRequest) {
	p, err := entry.Wait(ctx, append(w.permitOptions(ctx, s), semaphore.WithWaitTimeout(s.spec.WaitTimeout))...)
	if err == nil {
		return p, nil
	}
	rq := w.acquireFailed(s.key, token, err)
	if rq.why == RequeueStoreError {
		return nil, rq // the store failed: the place lapses by itself
	}
	return nil, w.parkAfterStandby(ctx, s, token, rq.why)
}

// parkAfterStandby puts a task that stood by back in the room of s, with
// its place, and sends it back for why.
func (w *Worker) parkAfterStandby(ctx context.Context, s seat, token string, why RequeueReason) *requeueRequest {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
	defer cancel()
	if err := w.sem.Park(pctx, s.key, s.capacity, token, s.room(w.cfg.Worker.ParkedRetry)); err != nil {
		// Its place lapses and the task comes back after its delay.
		taskID, _ := asynq.GetTaskID(ctx)
		w.log.Warn("worker: park a task (it comes back after its delay)", "key", s.key, "id", taskID, "err", err)
	}
	w.rooms.note(s)
	return &requeueRequest{key: s.key, why: why, token: token}
}

// permitOptions are the options of a seat taken for the task of ctx: its
// ID labels the seat.
func (w *Worker) permitOptions(ctx context.Context, s seat) []semaphore.AcquireOption {
	taskID, _ := asynq.GetTaskID(ctx)
	opts := []semaphore.AcquireOption{semaphore.WithTTL(s.spec.TTL), semaphore.WithHolder(taskID)}
	if s.spec.AutoRenewEnabled() {
		opts = append(opts, semaphore.WithAutoRenew())
	}
	return opts
}

// acquireFailed turns a failed Enter or standby wait into a requeue request.
func (w *Worker) acquireFailed(key string, token string, err error) *requeueRequest {
	why := RequeueStoreError
	var aerr *semaphore.AcquisitionError
	if errors.As(err, &aerr) {
		switch aerr.Reason {
		case semaphore.ReasonTimeout, semaphore.ReasonExhausted:
			why = RequeueTimeout
		case semaphore.ReasonShutdown:
			why = RequeueShutdown
		case semaphore.ReasonCanceled:
			why = requeueCanceled
		}
	}
	return &requeueRequest{key: key, why: why, token: token, err: err}
}

// release gives a seat back. (The release itself lets the next tasks out
// of the key's waiting room: see wake.go.)
func (w *Worker) release(ctx context.Context, key string, p *semaphore.Permit) {
	err := p.Release(context.WithoutCancel(ctx))
	switch {
	case errors.Is(err, semaphore.ErrPermitNotHeld):
		w.log.Warn("worker: the seat was lost before the task ended: the cap was not held for the whole run; raise the cap's ttl or turn on auto_renew",
			"key", key, "permit", p.ID())
	case err != nil:
		w.log.Warn("worker: release a seat (it lapses with its lease)", "key", key, "err", err)
	}
}

// runHolding runs h while the task holds its seats, and releases them.
func (w *Worker) runHolding(ctx context.Context, taskType string, t *asynq.Task, h asynq.Handler, held []heldSeat) error {
	for _, hs := range held {
		if hs.template != "" {
			w.recent.hold(hs.key, hs.spec.Key, hs.capacity, 1) // listed for monitoring while held
		}
	}
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var lostMu sync.Mutex
	var lostKey string
	// onLost runs only when a seat is lost: nothing waits while it is held.
	var onLost sync.WaitGroup
	stops := make([]func() bool, len(held))
	for i, hs := range held {
		onLost.Add(1)
		stops[i] = hs.permit.AfterLost(func() {
			defer onLost.Done()
			lostMu.Lock()
			lostKey = hs.key
			lostMu.Unlock()
			if obs := w.opts.observer; obs != nil {
				obs.LeaseLost(hs.key, taskType)
			}
			taskID, _ := asynq.GetTaskID(ctx)
			if hs.spec.OnLeaseLost == config.LeaseLostContinue {
				w.log.Warn("worker: lease lost; the task goes on (on_lease_lost: continue)", "key", hs.key, "type", taskType, "id", taskID)
				return
			}
			w.log.Warn("worker: lease lost; cancelling the task", "key", hs.key, "type", taskType, "id", taskID)
			cancel(fmt.Errorf("fleetcap: lease of %q lost", hs.key))
		})
	}
	err := h.ProcessTask(hctx, t)
	for _, stop := range stops {
		if stop() {
			onLost.Done()
		}
	}
	onLost.Wait()
	for _, hs := range held {
		w.release(ctx, hs.key, hs.permit)
		if hs.template != "" {
			w.recent.hold(hs.key, hs.spec.Key, hs.capacity, -1)
		}
	}
	lostMu.Lock()
	lost := lostKey
	lostMu.Unlock()
	if err != nil && lost != "" && context.Cause(hctx) != nil && ctx.Err() == nil {
		// The task was stopped because its seat was lost, not because it
		// failed: run it again once it has a seat.
		return w.requeue(ctx, taskType, t, &requeueRequest{key: lost, why: RequeueLeaseLost, err: err})
	}
	return err
}
