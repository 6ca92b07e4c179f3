package semaphore

import (
	"errors"
	"fmt"
)

// Reason says why an Acquire gave up.
type Reason string

// The reasons an Acquire fails with.
const (
	ReasonExhausted Reason = "exhausted" // WithMaxAttempts was reached
	ReasonTimeout   Reason = "timeout"   // WithWaitTimeout ran out
	ReasonError     Reason = "error"     // the store failed; Err holds the driver error
	ReasonShutdown  Reason = "shutdown"  // the Service was closed while waiting
	ReasonCanceled  Reason = "canceled"  // the caller's context is done; Err is ctx.Err()
)

// AcquisitionError is returned by Acquire (and WithPermit) when no seat was
// taken. Branch on Reason with errors.As.
type AcquisitionError struct {
	Key      string
	Reason   Reason
	Attempts int
	Err      error // the cause, returned by Unwrap
}

func (e *AcquisitionError) Error() string {
	msg := fmt.Sprintf("semaphore: acquire %q: %s after %d attempt(s)", e.Key, e.Reason, e.Attempts)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the cause.
func (e *AcquisitionError) Unwrap() error { return e.Err }

var (
	// ErrPermitNotHeld is returned by Release when the seat was already lost
	// (expired or force-released): the cap was not held for the whole run.
	ErrPermitNotHeld = errors.New("semaphore: permit not held")
	// ErrExtension is returned by Extend when the seat is gone on the store.
	ErrExtension = errors.New("semaphore: permit cannot be extended: seat lost")
	// ErrClosed is returned by calls made after Close.
	ErrClosed = errors.New("semaphore: service closed")
)

// errTimeout is the cause recorded for ReasonTimeout.
var errTimeout = errors.New("semaphore: wait timeout")

// errShutdown is the cause recorded for ReasonShutdown.
var errShutdown = errors.New("semaphore: service closed while waiting")
