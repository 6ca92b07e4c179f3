package admission

import "context"

// fencesKey is the context key of the seats of a running task, for their
// fences.
type fencesKey struct{}

// withFences gives the handler's ctx the seats held, whose fences Fence
// reads when asked (a seat lent from spare seats draws its fence then).
func withFences(ctx context.Context, held []heldSeat) context.Context {
	if len(held) == 0 {
		return ctx
	}
	return context.WithValue(ctx, fencesKey{}, held)
}

// Fence is, in a handler, the fencing token of its task's seat of key (the
// rendered key, such as "tenant:acme"): see semaphore.Permit.Fence. It
// reports false when the task holds no seat of key.
func Fence(ctx context.Context, key string) (uint64, bool) {
	held, _ := ctx.Value(fencesKey{}).([]heldSeat)
	for _, hs := range held {
		if hs.Key == key {
			return hs.permit.Fence(), true
		}
	}
	return 0, false
}
