// Package tasks holds fleetcap's task types. Each has a Type constant, a
// payload struct with a strict decoder, a constructor and a handler; the
// registry (All, Lookup) lists them for the worker and the enqueue command.
package tasks

import (
	"cmp"
	"slices"

	"github.com/hibiken/asynq"
)

// Definition describes one task type.
type Definition struct {
	Type string
	// Validate checks a payload as the handler's decoder does; its errors
	// match ErrInvalidPayload.
	Validate func(payload []byte) error
	// Handler runs the task.
	Handler asynq.Handler
	// Example is a valid example payload.
	Example string
}

// definitions builds the registry; each call returns fresh values.
func definitions() []Definition {
	return []Definition{
		{
			Type:     TypeReportFetch,
			Validate: func(b []byte) error { _, err := DecodeReportFetch(b); return err },
			Handler:  asynq.HandlerFunc(HandleReportFetch),
			Example:  `{"tenant_id":"acme","report":"monthly-usage"}`,
		},
		{
			Type:     TypeWebhookDeliver,
			Validate: func(b []byte) error { _, err := DecodeWebhookDeliver(b); return err },
			Handler:  NewWebhookDeliverer(),
			Example:  `{"tenant_id":"acme","url":"https://example.com/hooks/fleetcap","event":"invoice.paid","body":{"invoice_id":"inv_123"}}`,
		},
	}
}

// All returns every task type, sorted by Type.
func All() []Definition {
	defs := definitions()
	slices.SortFunc(defs, func(a, b Definition) int { return cmp.Compare(a.Type, b.Type) })
	return defs
}

// Lookup returns the definition of a task type.
func Lookup(taskType string) (Definition, bool) {
	for _, d := range definitions() {
		if d.Type == taskType {
			return d, true
		}
	}
	return Definition{}, false
}
