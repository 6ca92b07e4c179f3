// Package probe is the payload of the probe worker's task types
// (internal/testutil/probeworker), shared by the worker, the fleet tests and
// the benchmarks, which enqueue probes through package producer.
package probe

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Type is the probe task type.
const Type = "probe"

// Payload is a probe's payload. Other fields (such as a semaphore key
// template's tenant_id) may travel beside these: the probe ignores them.
type Payload struct {
	MS     int    `json:"ms"`               // how long the probe holds its seat
	Tenant string `json:"tenant,omitempty"` // counted per tenant when set
	Fail   bool   `json:"fail,omitempty"`   // fail (once per task) to exercise retries
	// EnqueuedUS is when the task was enqueued (Unix µs, this host's
	// clock); when set, the probe records the time from it to its start
	// (the pickup latency).
	EnqueuedUS int64 `json:"enqueued_us,omitempty"`
}

// Decode reads a probe's payload.
func Decode(b []byte) (Payload, error) {
	var p Payload
	if err := json.Unmarshal(b, &p); err != nil {
		return Payload{}, fmt.Errorf("probe payload: %w", err)
	}
	if p.MS < 0 {
		return Payload{}, errors.New("probe payload: ms must not be negative")
	}
	return p, nil
}

// Validate checks a probe's payload as the probe worker reads it (for
// producer.WithValidator).
func Validate(b []byte) error {
	_, err := Decode(b)
	return err
}
