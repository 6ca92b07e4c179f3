package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
)

// Delays of a requeued task before asynq brings it back by itself. A parked
// task is normally woken much sooner, when a seat frees; the delay is only
// the safety net for seats that free without a release (an expired lease).
const (
	parkDelay    = 10 * time.Second
	retryDelay   = time.Second     // shutdown, lease lost, timeout without parking
	outageDelay  = 5 * time.Second // the store failed
	copiedHeader = "fleetcap-requeued-from"
)

// RequeueError is what a capped handler returns when its task goes back to
// its queue without a seat. asynq does not count it as a failure (see
// IsFailure) and brings the task back after Delay (see RetryDelay).
type RequeueError struct {
	Key   string        // the semaphore that had no seat
	Why   string        // "full", "timeout", "shutdown", "lease_lost" or "error"
	Delay time.Duration // until asynq brings the task back by itself
	Err   error         // the cause, if any
}

func (e *RequeueError) Error() string {
	msg := fmt.Sprintf("%s (%s)", requeueMark(e.Key), e.Why)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the cause.
func (e *RequeueError) Unwrap() error { return e.Err }

// requeueMark is the start of a RequeueError's message, which asynq keeps
// with the task while it waits: a wake-up checks it to bring back only a
// task that still waits for a seat of key (see parking).
func requeueMark(key string) string {
	return fmt.Sprintf("fleetcap: requeued without a seat of %q", key)
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
