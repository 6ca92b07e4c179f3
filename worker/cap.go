package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/semaphore"
)

// capSpec is one declared cap, parsed.
type capSpec struct {
	CapConfig
	tmpl    *KeyTemplate
	standby int
}

// capTable holds the caps of every task type.
type capTable struct {
	byType map[string][]capSpec

	mu       sync.Mutex
	standing map[string]int       // key -> tasks of this process in standby for it
	waiting  map[string]int       // key -> tasks of this process waiting for a seat of it (standby or mode wait)
	fullAt   map[string]time.Time // key -> when this process last found it full
}

// Full hints. A task with several caps first tries the ones this process
// found full within fullHintFor, so that while one tenant's cap is full its
// tasks go back without taking (and giving back) a seat of the shared cap
// first. The hints stay few: a key leaves when a seat of it is taken, and
// old ones are dropped when there are more than fullHintMax.
const (
	fullHintFor = time.Second
	fullHintMax = 1024
)

// markFull notes that key was found full.
func (t *capTable) markFull(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if len(t.fullAt) >= fullHintMax {
		for k, at := range t.fullAt {
			if now.Sub(at) > fullHintFor {
				delete(t.fullAt, k)
			}
		}
		if len(t.fullAt) >= fullHintMax {
			return
		}
	}
	t.fullAt[key] = now
}

// markFree forgets a full hint once a seat of key was taken.
func (t *capTable) markFree(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.fullAt, key)
}

// attemptOrder is the order in which a task tries its seats: the seats
// hinted full first, then the others, each group in key order. The order
// only saves work: no seat is ever held while waiting, so any order is
// free of deadlock; waiting itself is for one seat at a time.
func (t *capTable) attemptOrder(seats []seat) []int {
	order := make([]int, 0, len(seats))
	if len(seats) > 1 {
		t.mu.Lock()
		now := time.Now()
		for i, s := range seats {
			if at, ok := t.fullAt[s.key]; ok && now.Sub(at) <= fullHintFor {
				order = append(order, i)
			}
		}
		t.mu.Unlock()
	}
	for i := range seats {
		if !slices.Contains(order, i) {
			order = append(order, i)
		}
	}
	return order
}

func newCapTable(cfg *Config) (*capTable, error) {
	t := &capTable{byType: map[string][]capSpec{}, standing: map[string]int{}, waiting: map[string]int{}, fullAt: map[string]time.Time{}}
	for typ, tc := range cfg.Tasks {
		for _, c := range tc.Caps() {
			kt, err := c.KeyTemplate()
			if err != nil {
				return nil, fmt.Errorf("worker: task %q: %w", typ, err)
			}
			standby := min(c.Capacity, max(1, cfg.Worker.Concurrency/2))
			if c.Standby != nil {
				standby = *c.Standby
			}
			t.byType[typ] = append(t.byType[typ], capSpec{CapConfig: c, tmpl: kt, standby: standby})
		}
	}
	return t, nil
}

// templateOf returns the template that renders key, or key itself when it
// is a declared plain key or no template renders it. Plain keys win, then
// templates in key order.
func (t *capTable) templateOf(key string) string {
	var tmpls []string
	for _, specs := range t.byType {
		for _, s := range specs {
			if !s.tmpl.IsTemplate() {
				if s.Key == key {
					return key
				}
				continue
			}
			if s.tmpl.matches(key) {
				tmpls = append(tmpls, s.Key)
			}
		}
	}
	if len(tmpls) == 0 {
		return key
	}
	return slices.Min(tmpls)
}

func (t *capTable) types() []string {
	var out []string
	for typ := range t.byType {
		out = append(out, typ)
	}
	sort.Strings(out)
	return out
}

// enterStandby takes a standby place of key if one is free.
func (t *capTable) enterStandby(key string, limit int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.standing[key] >= limit {
		return false
	}
	t.standing[key]++
	return true
}

func (t *capTable) leaveStandby(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.standing[key]--; t.standing[key] <= 0 {
		delete(t.standing, key)
	}
}

// wait counts a task of this process waiting for a seat of key (delta +1
// when it starts, -1 when it stops).
func (t *capTable) wait(key string, delta int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waiting[key] += delta; t.waiting[key] <= 0 {
		delete(t.waiting, key)
	}
}

// hasWaiters reports whether a task of this process waits for a seat of
// key. Its entry in the fleet-wide line is served before any one-shot try,
// so a try for another task would only find the semaphore full.
func (t *capTable) hasWaiters(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.waiting[key] > 0
}

// seat is one cap of one task, its key rendered.
type seat struct {
	spec     capSpec
	key      string
	capacity int
}

// seatsFor renders the caps of a task, sorted by key: every task takes its
// seats in the same order.
func (w *Worker) seatsFor(specs []capSpec, t *asynq.Task) ([]seat, error) {
	seats := make([]seat, 0, len(specs))
	for _, s := range specs {
		key, err := s.tmpl.Render(t.Payload())
		if err != nil {
			return nil, err // names the template and the field
		}
		capacity := s.CapacityFor(key)
		if s.tmpl.IsTemplate() {
			w.recent.touch(key, s.Key, capacity)
		}
		seats = append(seats, seat{spec: s, key: key, capacity: capacity})
	}
	slices.SortFunc(seats, func(a, b seat) int { return compareStrings(a.key, b.key) })
	// Two caps that render one key ("region:{from}" and "region:{to}" of
	// a task that stays in its region) are one semaphore: one seat of it,
	// of the smaller capacity, holds both caps.
	out := seats[:0]
	for _, s := range seats {
		if n := len(out); n > 0 && out[n-1].key == s.key {
			if s.capacity < out[n-1].capacity {
				out[n-1] = s
			}
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// heldSeat is a seat a task holds while it runs.
type heldSeat struct {
	seat
	permit *semaphore.Permit
}

// capped wraps h in the caps of taskType, if it has any.
func (w *Worker) capped(taskType string, h asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		specs := w.caps.byType[taskType]
		if len(specs) == 0 {
			return h.ProcessTask(ctx, t)
		}
		seats, err := w.seatsFor(specs, t)
		if err != nil {
			// Never run a task without its cap: its payload is broken.
			return fmt.Errorf("worker: task %s not run: its payload cannot render its semaphore key: %w: %w", taskType, err, asynq.SkipRetry)
		}
		for tries := 0; ; tries++ {
			// After a park found a seat free, try for real: our own
			// waiters' claim on the line would only send us back.
			held, rq := w.takeSeats(ctx, t, seats, tries > 0)
			if rq == nil {
				return w.runHolding(ctx, taskType, t, h, held)
			}
			if rq.park && !w.noRetryLeft(ctx) {
				parked, err := w.parkTask(ctx, rq)
				if err == nil && !parked && tries < 10 {
					continue // a seat was released meanwhile: try again
				}
				rq.park = false
			}
			return w.requeue(ctx, taskType, t, rq)
		}
	})
}

// noRetryLeft reports whether asynq would archive the task on any error.
func (w *Worker) noRetryLeft(ctx context.Context) bool {
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	return retried >= maxRetry
}

// parkTask parks the running task on rq.key; false when a seat was released
// since the task last looked.
func (w *Worker) parkTask(ctx context.Context, rq *requeueRequest) (bool, error) {
	queue, _ := asynq.GetQueueName(ctx)
	taskID, _ := asynq.GetTaskID(ctx)
	parked, err := w.parking.park(ctx, rq.key, rq.capacity, queue, taskID)
	if err != nil {
		w.log.Warn("worker: park a task (it comes back after its delay)", "key", rq.key, "id", taskID, "err", err)
	}
	return parked, err
}

// requeueRequest says why and how a task goes back without a seat.
type requeueRequest struct {
	key      string
	why      string
	park     bool // wake it when a seat of key frees
	capacity int  // the semaphore's, for parking
	err      error
}

// takeSeats takes a seat of every cap: those this process found full lately
// first, then in key order (see attemptOrder). It never waits while it holds
// a seat: when a cap is full it gives back what it took, then waits on
// (mode wait, or a standby place in mode requeue) or gives up on that cap.
func (w *Worker) takeSeats(ctx context.Context, t *asynq.Task, seats []seat, mustTry bool) ([]heldSeat, *requeueRequest) {
	taken := make([]*semaphore.Permit, len(seats))
	giveBack := func() {
		for i, p := range taken {
			if p != nil {
				w.release(ctx, seats[i].key, p)
				taken[i] = nil
			}
		}
	}
	var waitDeadline time.Time
	waited := false
	for {
		full := -1
		for _, i := range w.caps.attemptOrder(seats) {
			s := seats[i]
			if taken[i] != nil {
				continue
			}
			if !mustTry && w.caps.hasWaiters(s.key) {
				// Tasks of ours wait in line for this key: the try
				// would fail behind them. Saves a script call per task
				// while a cap is contended.
				full = i
				break
			}
			p, err := w.sem.TryAcquire(ctx, s.key, s.capacity, w.permitOptions(ctx, s)...)
			if err != nil {
				giveBack()
				return nil, w.acquireFailed(s.key, err)
			}
			if p == nil {
				full = i
				if len(seats) > 1 {
					w.caps.markFull(s.key)
				}
				break
			}
			if len(seats) > 1 {
				w.caps.markFree(s.key)
			}
			taken[i] = p
		}
		if full < 0 {
			held := make([]heldSeat, len(seats))
			for i, s := range seats {
				held[i] = heldSeat{seat: s, permit: taken[i]}
			}
			return held, nil
		}
		giveBack()

		s := seats[full]
		waitMode := s.spec.Mode == ModeWait
		if !waited && (waitMode || (s.spec.standby > 0 && w.caps.enterStandby(s.key, s.spec.standby))) {
			if waitDeadline.IsZero() {
				waitDeadline = time.Now().Add(s.spec.WaitTimeout)
			}
			p, err := w.waitForSeat(ctx, s, time.Until(waitDeadline))
			if !waitMode {
				w.caps.leaveStandby(s.key)
			}
			if err == nil {
				taken[full] = p
				continue
			}
			if rq := w.acquireFailed(s.key, err); rq.why != "timeout" {
				return nil, rq
			}
			waited = true
			continue // one more look, then park
		}
		why := "full"
		if waited {
			why = "timeout"
		}
		return nil, &requeueRequest{key: s.key, why: why, park: true, capacity: s.capacity}
	}
}

// waitForSeat waits up to budget for a seat of s.
func (w *Worker) waitForSeat(ctx context.Context, s seat, budget time.Duration) (*semaphore.Permit, error) {
	if budget <= 0 {
		return nil, &semaphore.AcquisitionError{Key: s.key, Reason: semaphore.ReasonTimeout}
	}
	w.caps.wait(s.key, 1)
	defer w.caps.wait(s.key, -1)
	if obs := w.opts.observer; obs != nil {
		obs.Waiting(s.key, 1)
		defer obs.Waiting(s.key, -1)
	}
	return w.sem.Acquire(ctx, s.key, s.capacity, append(w.permitOptions(ctx, s), semaphore.WithWaitTimeout(budget))...)
}

// permitOptions are the options of a seat taken for the task of ctx: its
// ID labels the seat, and taking it takes the task's token out of the
// key's parked line.
func (w *Worker) permitOptions(ctx context.Context, s seat) []semaphore.AcquireOption {
	taskID, _ := asynq.GetTaskID(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	opts := []semaphore.AcquireOption{semaphore.WithTTL(s.spec.TTL), semaphore.WithHolder(taskID), semaphore.WithUnpark(parkToken(queue, taskID))}
	if s.spec.AutoRenewEnabled() {
		opts = append(opts, semaphore.WithAutoRenew())
	}
	return opts
}

// acquireFailed turns a failed acquisition into a requeue request.
func (w *Worker) acquireFailed(key string, err error) *requeueRequest {
	var aerr *semaphore.AcquisitionError
	if !errors.As(err, &aerr) {
		return &requeueRequest{key: key, why: "error", err: err}
	}
	switch aerr.Reason {
	case semaphore.ReasonTimeout, semaphore.ReasonExhausted:
		return &requeueRequest{key: key, why: "timeout", park: true}
	case semaphore.ReasonShutdown:
		return &requeueRequest{key: key, why: "shutdown"}
	case semaphore.ReasonCanceled:
		return &requeueRequest{key: key, why: "canceled", err: err}
	default:
		return &requeueRequest{key: key, why: "error", err: err}
	}
}

// release gives a seat back. (The release itself wakes a task parked on
// the key: see parking.)
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
		if hs.spec.tmpl.IsTemplate() {
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
			if hs.spec.OnLeaseLost == LeaseLostContinue {
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
		if hs.spec.tmpl.IsTemplate() {
			w.recent.hold(hs.key, hs.spec.Key, hs.capacity, -1)
		}
	}
	lostMu.Lock()
	lost := lostKey
	lostMu.Unlock()
	if err != nil && lost != "" && context.Cause(hctx) != nil && ctx.Err() == nil {
		// The task was stopped because its seat was lost, not because it
		// failed: run it again once it has a seat.
		return w.requeue(ctx, taskType, t, &requeueRequest{key: lost, why: "lease_lost", err: err})
	}
	return err
}

// requeue sends the task back to asynq without a failure. A task with no
// retry left (max_retry 0, or its last retry) would be archived by asynq
// whatever IsFailure says, so it is enqueued again as a copy and the
// original is revoked.
func (w *Worker) requeue(ctx context.Context, taskType string, t *asynq.Task, rq *requeueRequest) error {
	if rq.why == "canceled" {
		return rq.err // asynq is ending the task (deadline or shutdown)
	}
	if obs := w.opts.observer; obs != nil {
		obs.Requeued(rq.key, taskType, rq.why)
	}
	delay := retryDelay
	switch {
	case rq.park || rq.why == "full" || rq.why == "timeout":
		delay = parkDelay
	case rq.why == "error":
		delay = outageDelay
	}
	queue, _ := asynq.GetQueueName(ctx)
	taskID, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	if retried >= maxRetry {
		return w.requeueCopy(ctx, taskType, t, rq, queue, taskID, max(maxRetry-retried, 0), delay)
	}
	return &RequeueError{Key: rq.key, Why: rq.why, Delay: delay, Err: rq.err}
}

// requeueCopy enqueues a copy of a task that has no retry left and revokes
// the original.
func (w *Worker) requeueCopy(ctx context.Context, taskType string, t *asynq.Task, rq *requeueRequest, queue, taskID string, retriesLeft int, delay time.Duration) error {
	headers := make(map[string]string, len(t.Headers())+1)
	for k, v := range t.Headers() {
		headers[k] = v
	}
	headers[copiedHeader] = taskID
	opts := []asynq.Option{asynq.Queue(queue), asynq.MaxRetry(retriesLeft), asynq.ProcessIn(delay)}
	if tc, ok := w.cfg.Tasks[taskType]; ok && tc.Timeout > 0 {
		opts = append(opts, asynq.Timeout(tc.Timeout))
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	info, err := w.client.EnqueueContext(ectx, asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers), opts...)
	if err != nil {
		return fmt.Errorf("fleetcap: no seat of %q and no retry left, and enqueueing a copy failed: %w", rq.key, err)
	}
	if rq.park {
		parked, err := w.parking.park(ctx, rq.key, rq.capacity, queue, info.ID)
		switch {
		case err != nil:
			w.log.Warn("worker: park a task (it comes back after its delay)", "key", rq.key, "id", info.ID, "err", err)
		case !parked:
			// A seat was released meanwhile: the copy goes straight to its queue.
			if err := w.insp.RunTask(queue, info.ID); err != nil {
				w.log.Warn("worker: run a requeued copy (it comes back after its delay)", "id", info.ID, "err", err)
			}
		}
	}
	w.log.Info("worker: no seat and no retry left: requeued as a copy", "key", rq.key, "id", taskID, "copy", info.ID, "why", rq.why)
	w.asynqLog.revoking(taskID)
	// RevokeTask drops the original as done; the RequeueError keeps it out
	// of the failures.
	return fmt.Errorf("requeued as task %s: %w: %w", info.ID, &RequeueError{Key: rq.key, Why: rq.why, Err: rq.err}, asynq.RevokeTask)
}
