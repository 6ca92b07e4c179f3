package admission

import "context"

// fencesKey is the context key of the fences of a running task's seats.
type fencesKey struct{}

// withFences gives the handler's ctx the fences of the seats held.
func withFences(ctx context.Context, held []heldSeat) context.Context {
	if len(held) == 0 {
		return ctx
	}
	fences := make(map[string]uint64, len(held))
	for _, hs := range held {
		fences[hs.Key] = hs.permit.Fence()
	}
	return context.WithValue(ctx, fencesKey{}, fences)
}

// Fence is, in a handler, the fencing token of its task's seat of key (the
// rendered key, such as "tenant:acme"): see semaphore.Permit.Fence. It
// reports false when the task holds no seat of key.
func Fence(ctx context.Context, key string) (uint64, bool) {
	fences, _ := ctx.Value(fencesKey{}).(map[string]uint64)
	fence, ok := fences[key]
	return fence, ok
}
