package worker_test

import (
	"context"
	"fmt"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/producer"
	"github.com/fleetcap/fleetcap/tasks"
	"github.com/fleetcap/fleetcap/worker"
)

// exampleConfig is a config.yaml whose report:fetch tasks take one of 5
// seats of legacy-api across the fleet, on the embedded Redis (no
// redis.url).
const exampleConfig = `
redis:
  embedded_addr: 127.0.0.1:16381
tasks:
  report:fetch:
    semaphore: {key: legacy-api, capacity: 5, mode: requeue}
`

// A worker serves report:fetch under the caps of its config; a producer
// enqueues one task for it.
func ExampleWorker() {
	cfg, err := worker.ParseConfig([]byte(exampleConfig)) // or worker.LoadConfig("config.yaml")
	if err != nil {
		panic(err)
	}
	w, err := worker.New(cfg)
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	w.HandleFunc(tasks.TypeReportFetch, func(ctx context.Context, t *asynq.Task) error {
		seats, _ := w.Semaphore().UsedPermits(ctx, "legacy-api") // the cap holds a seat for this task
		fmt.Printf("fetching %s holding %d of 5 seats\n", t.Payload(), seats)
		stop() // one task is enough for the example
		return nil
	})

	p, err := producer.New(cfg)
	if err != nil {
		panic(err)
	}
	defer p.Close()
	if _, err := p.Enqueue(ctx, tasks.TypeReportFetch, []byte(`{"tenant_id":"acme"}`)); err != nil {
		panic(err)
	}

	if err := w.Run(ctx); err != nil { // until ctx is done, then a graceful shutdown
		panic(err)
	}
	// Output:
	// fetching {"tenant_id":"acme"} holding 1 of 5 seats
}

// A handler passes its seat's fence to the capped resource, which refuses
// writes with a fence below the highest it has seen (see
// semaphore.Permit.Fence): a task whose seat lapsed while it was paused
// cannot overwrite the work of the task that took the seat after it.
func ExampleFence() {
	cfg, err := worker.ParseConfig([]byte(exampleConfig))
	if err != nil {
		panic(err)
	}
	w, err := worker.New(cfg)
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	w.HandleFunc(tasks.TypeReportFetch, func(ctx context.Context, t *asynq.Task) error {
		defer stop()
		fence, ok := worker.Fence(ctx, "legacy-api")
		_, other := worker.Fence(ctx, "another-key")
		fmt.Println("a fence of legacy-api:", ok && fence > 0, "of a key it holds no seat of:", other)
		return nil // here: legacyAPI.Write(ctx, fence, report)
	})

	p, err := producer.New(cfg)
	if err != nil {
		panic(err)
	}
	defer p.Close()
	if _, err := p.Enqueue(ctx, tasks.TypeReportFetch, []byte(`{"tenant_id":"acme"}`)); err != nil {
		panic(err)
	}
	if err := w.Run(ctx); err != nil {
		panic(err)
	}
	// Output:
	// a fence of legacy-api: true of a key it holds no seat of: false
}
