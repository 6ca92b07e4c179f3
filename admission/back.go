package admission

import (
	"fmt"
	"strings"
)

// Reason says why a task went back to its queue without running.
type Reason string

// The reasons a task goes back.
const (
	ReasonFull        Reason = "full"         // no seat and no standby place: parked
	ReasonTimeout     Reason = "timeout"      // stood by its wait_timeout without a seat: parked
	ReasonShutdown    Reason = "shutdown"     // the worker shut down while it stood by: parked
	ReasonLeaseLost   Reason = "lease_lost"   // its seat was lost while it ran
	ReasonRateLimited Reason = "rate_limited" // a rate limit had no token: parked
	ReasonStoreError  Reason = "error"        // the store failed
	// ReasonCanceled: asynq itself ends the task (its deadline, or the end
	// of a shutdown); its error goes back as it is.
	ReasonCanceled Reason = "canceled"
)

// Back says why a task goes back to its queue without running, and
// whether it waits in the room of the limit that held it back, from where
// a wake-up brings it.
type Back struct {
	Key    string // the limit that held it back
	Kind   Kind
	Why    Reason
	Parked bool  // it waits in Key's room
	Err    error // the cause, if any
}

// WaitsForHeader marks a task enqueued to wait for a seat of the key it
// names (a producer's task that found its cap busy): a wake-up may bring it
// back while it is scheduled.
const WaitsForHeader = "fleetcap-waits-for"

// Mark is how a task that went back to wait says so in asynq: the start of
// the error message asynq keeps with it in its retry set, by which a
// wake-up knows the task still waits for that limit (asynqx.Wake). It is
// the one wire form of it: "fleetcap: requeued without a seat of "K""
// for a cap, "fleetcap: requeued without tokens of "K"" for a rate limit.
func Mark(kind Kind, key string) string {
	if kind == KindRate {
		return fmt.Sprintf("fleetcap: requeued without tokens of %q", key)
	}
	return fmt.Sprintf("fleetcap: requeued without a seat of %q", key)
}

// Message is the error message of a task that goes back: its mark, why,
// and the cause.
func (b *Back) Message() string {
	var sb strings.Builder
	sb.WriteString(Mark(b.Kind, b.Key))
	fmt.Fprintf(&sb, " (%s)", b.Why)
	if b.Err != nil {
		sb.WriteString(": " + b.Err.Error())
	}
	return sb.String()
}
