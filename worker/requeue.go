package worker

import (
	"context"
	"errors"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/admission"
)

// Going back without running. A limited task that a limit holds back
// returns to asynq without counting as a failure (IsFailure) and comes
// back after the delay its reason asks for (RetryDelay): the requeue policy
// below. A task parked in a waiting room is brought back sooner, when its
// turn comes (package admission): its delay is only the safety net.

// RequeueReason says why a task went back to its queue (admission.Reason).
type RequeueReason = admission.Reason

// The reasons a task goes back.
const (
	RequeueFull        = admission.ReasonFull        // no seat and no standby place: parked
	RequeueTimeout     = admission.ReasonTimeout     // stood by its wait_timeout without a seat: parked
	RequeueShutdown    = admission.ReasonShutdown    // the worker shut down while it stood by: parked
	RequeueLeaseLost   = admission.ReasonLeaseLost   // its seat was lost while it ran
	RequeueRateLimited = admission.ReasonRateLimited // a rate limit had no token: parked
	RequeueStoreError  = admission.ReasonStoreError  // the store failed
)

// Delays of a task that goes back, for the reasons that are not parked.
const (
	retryDelay  = time.Second     // lease lost
	outageDelay = 5 * time.Second // the store failed
)

// WaitsForHeader marks a task enqueued to wait for a seat of the key it
// names (admission.WaitsForHeader).
const WaitsForHeader = admission.WaitsForHeader

// delay is how long asynq keeps the task away by itself.
func (w *Worker) delay(b *admission.Back) time.Duration {
	switch {
	case b.Why == RequeueShutdown:
		return retryDelay // another worker may take it soon
	case b.Parked:
		return w.cfg.Worker.ParkedRetry
	case b.Why == RequeueStoreError:
		return outageDelay
	default:
		return retryDelay
	}
}

// RequeueError is what a limited handler returns when its task goes back
// to its queue without running. asynq does not count it as a failure (see
// IsFailure) and brings the task back after Delay (see RetryDelay). Its
// message starts with the task's mark (admission.Mark), by which a wake-up
// knows the task still waits.
type RequeueError struct {
	Key   string        // the semaphore that had no seat, or the rate limit that had no token
	Why   RequeueReason // why the task went back
	Delay time.Duration // until asynq brings the task back by itself
	Err   error         // the cause, if any

	back *admission.Back
}

func (e *RequeueError) Error() string {
	if e.back != nil {
		return e.back.Message()
	}
	return (&admission.Back{Key: e.Key, Kind: admission.KindCap, Why: e.Why, Err: e.Err}).Message()
}

// Unwrap returns the cause.
func (e *RequeueError) Unwrap() error { return e.Err }

// IsFailure is the asynq Config.IsFailure of fleetcap workers: a requeue is
// not a failure and spends no retry.
func IsFailure(err error) bool {
	var rq *RequeueError
	return !errors.As(err, &rq)
}

// RetryDelay is the asynq Config.RetryDelayFunc of fleetcap workers: a
// requeue comes back after its own delay; failures back off as asynq's
// default does.
func RetryDelay(n int, err error, t *asynq.Task) time.Duration {
	var rq *RequeueError
	if errors.As(err, &rq) {
		return rq.Delay
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// requeue sends the task back to asynq without a failure. A task with no
// retry left (max_retry 0, or its last retry) would be archived by asynq
// whatever IsFailure says: the worker's Redis client turns that archive
// into a retry (asynqx.ServerClient.Keep), so that the task keeps its ID,
// its retry count and its place in the waiting room.
func (w *Worker) requeue(ctx context.Context, taskType string, b *admission.Back) error {
	if b.Why == admission.ReasonCanceled {
		return b.Err // asynq is ending the task (deadline or shutdown)
	}
	if obs := w.opts.observer; obs != nil {
		obs.Requeued(b.Key, taskType, string(b.Why))
	}
	delay := w.delay(b)
	if noRetryLeft(ctx) {
		id, _ := asynq.GetTaskID(ctx)
		w.server.Keep(id, delay)
	}
	return &RequeueError{Key: b.Key, Why: b.Why, Delay: delay, Err: b.Err, back: b}
}

// noRetryLeft reports whether asynq would archive the task on any error.
func noRetryLeft(ctx context.Context) bool {
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	return retried >= maxRetry
}

// storeCallTimeout bounds one call the worker makes after a context may be
// done.
const storeCallTimeout = 5 * time.Second
