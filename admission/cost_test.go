package admission

import (
	"context"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/semaphore"
)

// BenchmarkSpareSeatPath is the Go cost of a task's path past a cap far
// from full, S2's path: Admit, then Run around a handler that does
// nothing. Its seat is lent in memory from the spare seats the first task
// took, so that no task after the first calls Redis.
func BenchmarkSpareSeatPath(b *testing.B) {
	rdb := redistest.Start(b).Client()
	a := newAdmitter(b, rdb, "tasks: {job: {semaphore: {key: k, capacity: 1000}}}\n", semaphore.Options{SpareSeats: 20})
	ctx := context.Background()
	task := asynq.NewTask("job", nil)
	noop := asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })
	b.ReportAllocs()
	for b.Loop() {
		adm, back, err := a.Admit(ctx, "job", task)
		if err != nil || back != nil {
			b.Fatalf("Admit: back %v, err %v", back, err)
		}
		if back, err := adm.Run(ctx, noop, task); err != nil || back != nil {
			b.Fatalf("Run: back %v, err %v", back, err)
		}
	}
}
