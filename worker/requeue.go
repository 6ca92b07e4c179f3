package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
)

// Going back without a seat. A capped task that gets no seat returns to
// asynq without counting as a failure (IsFailure) and comes back after the
// delay its reason asks for (RetryDelay): the requeue policy below. A task
// parked in a waiting room is brought back sooner, when a place frees (see
// wake.go): its delay is only the safety net.

// RequeueReason says why a capped task went back to its queue.
type RequeueReason string

// The reasons a capped task goes back.
const (
	RequeueFull        RequeueReason = "full"         // no seat and no standby place: parked
	RequeueTimeout     RequeueReason = "timeout"      // stood by its wait_timeout without a seat: parked
	RequeueShutdown    RequeueReason = "shutdown"     // the worker shut down while it stood by: parked
	RequeueLeaseLost   RequeueReason = "lease_lost"   // its seat was lost while it ran
	RequeueRateLimited RequeueReason = "rate_limited" // a rate limit had no token: parked
	RequeueStoreError  RequeueReason = "error"        // the store failed
	// requeueCanceled: asynq itself ends the task (its deadline, or the
	// end of a shutdown); its error goes back as it is.
	requeueCanceled RequeueReason = "canceled"
)

// Delays of a task that goes back, for the reasons that are not parked.
const (
	retryDelay  = time.Second     // lease lost
	outageDelay = 5 * time.Second // the store failed
)

// WaitsForHeader marks a task enqueued to wait for a seat of the key it
// names (a producer's task that found the cap busy): a wake-up may bring
// it back while it is scheduled.
const WaitsForHeader = "fleetcap-waits-for"

// requeueRequest says why and how a task goes back without a seat.
type requeueRequest struct {
	key   string
	why   RequeueReason
	token string // set when the task is parked in key's waiting room
	err   error
}

// parked reports whether a wake-up brings the task back.
func (rq *requeueRequest) parked() bool { return rq.token != "" }

// delay is how long asynq keeps the task away by itself.
func (w *Worker) delay(rq *requeueRequest) time.Duration {
	switch {
	case rq.why == RequeueShutdown:
		return retryDelay // another worker may take it soon
	case rq.parked():
		return w.cfg.Worker.ParkedRetry
	case rq.why == RequeueStoreError:
		return outageDelay
	default:
		return retryDelay
	}
}

// RequeueError is what a capped handler returns when its task goes back to
// its queue without a seat. asynq does not count it as a failure (see
// IsFailure) and brings the task back after Delay (see RetryDelay).
type RequeueError struct {
	Key   string        // the semaphore that had no seat, or the rate limit that had no token
	Why   RequeueReason // why the task went back
	Delay time.Duration // until asynq brings the task back by itself
	Err   error         // the cause, if any
}

func (e *RequeueError) Error() string {
	mark := requeueMark(e.Key)
	if e.Why == RequeueRateLimited {
		mark = rateMark(e.Key)
	}
	msg := fmt.Sprintf("%s (%s)", mark, e.Why)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the cause.
func (e *RequeueError) Unwrap() error { return e.Err }

// requeueMark is the start of a RequeueError's message, which asynq keeps
// with the task while it waits: a wake-up checks it to bring back only a
// task that still waits for a seat of key (see wake.go).
func requeueMark(key string) string {
	return fmt.Sprintf("fleetcap: requeued without a seat of %q", key)
}

// rateMark is requeueMark for a task that waits for a rate limit's tokens.
func rateMark(key string) string {
	return fmt.Sprintf("fleetcap: requeued without tokens of %q", key)
}

// IsFailure is the asynq Config.IsFailure of fleetcap workers: a requeue for
// a seat is not a failure and spends no retry.
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
func (w *Worker) requeue(ctx context.Context, taskType string, t *asynq.Task, rq *requeueRequest) error {
	if rq.why == requeueCanceled {
		return rq.err // asynq is ending the task (deadline or shutdown)
	}
	if obs := w.opts.observer; obs != nil {
		obs.Requeued(rq.key, taskType, string(rq.why))
	}
	delay := w.delay(rq)
	if noRetryLeft(ctx) {
		id, _ := asynq.GetTaskID(ctx)
		w.server.Keep(id, delay)
	}
	return &RequeueError{Key: rq.key, Why: rq.why, Delay: delay, Err: rq.err}
}

// storeCallTimeout bounds one call the worker makes on a task's behalf
// after its context may be done.
const storeCallTimeout = 5 * time.Second
