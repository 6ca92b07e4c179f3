package semaphore

import "time"

// Outcome is how one Acquire, TryAcquire or Enter call ended:
// OutcomeAcquired, OutcomeFull (TryAcquire found no seat, Enter parked the
// token), OutcomeStandby, or one of the Reasons.
type Outcome string

// The outcomes that are not a Reason.
const (
	OutcomeAcquired Outcome = "acquired"
	OutcomeFull     Outcome = "full"
	// OutcomeStandby: Enter found no free seat and gave a standby place.
	// The task has not failed to take a seat yet: its Entry.Wait is the
	// next call, and its own event tells how the wait ended.
	OutcomeStandby Outcome = "standby"
)

// AcquireEvent describes one Acquire, TryAcquire, Enter or Entry.Wait call.
type AcquireEvent struct {
	Key      string
	Capacity int
	Outcome  Outcome // OutcomeAcquired, OutcomeFull, OutcomeStandby, or Outcome(reason)
	Attempts int     // store round trips made for this call
	Wait     time.Duration
}

// Acquired reports whether the call took a seat.
func (e AcquireEvent) Acquired() bool { return e.Outcome == OutcomeAcquired }

// ReleaseEvent describes the release of a permit.
type ReleaseEvent struct {
	Key  string
	Held time.Duration // from acquisition to release
	Lost bool          // the seat was already gone (ErrPermitNotHeld)
}

// Observer receives the semaphore's events; monitoring turns them into
// metrics. Calls are made synchronously from the goroutine that caused the
// event, so implementations must be fast and safe for concurrent use.
type Observer interface {
	// Acquire is called once per Acquire, TryAcquire, Enter or Entry.Wait
	// call.
	Acquire(AcquireEvent)
	// Release is called once per permit, on its first Release.
	Release(ReleaseEvent)
	// Lost is called when auto-renewal learns that a seat is gone.
	Lost(key string)
	// ActiveChanged is called with +1 when this process takes a seat and -1
	// when it lets one go (release, or loss noticed).
	ActiveChanged(key string, delta int)
}
