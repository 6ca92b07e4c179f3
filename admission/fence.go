package admission

import (
	"context"

	"github.com/fleetcap/fleetcap/semaphore"
)

// fencesKey is the context key of the seats of a running task, for their
// fences.
type fencesKey struct{}

// withFences gives the handler's ctx the seats held, whose fences Fence
// reads when asked (a seat lent from spare seats draws its fence then).
func withFences(ctx context.Context, held []heldSeat) context.Context {
	if len(held) == 0 {
		return ctx
	}
	seats := make(map[string]*semaphore.Permit, len(held))
	for _, hs := range held {
		seats[hs.Key] = hs.permit
	}
	return context.WithValue(ctx, fencesKey{}, seats)
}

// Fence is, in a handler, the fencing token of its task's seat of key (the
// rendered key, such as "tenant:acme"): see semaphore.Permit.Fence. It
// reports false when the task holds no seat of key.
func Fence(ctx context.Context, key string) (uint64, bool) {
	seats, _ := ctx.Value(fencesKey{}).(map[string]*semaphore.Permit)
	p, ok := seats[key]
	if !ok {
		return 0, false
	}
	return p.Fence(), true
}
