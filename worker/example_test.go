package worker_test

import (
	"context"
	"fmt"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/worker"
)

// A worker whose report:fetch tasks take one of 5 seats of legacy-api
// across the fleet, on the embedded Redis (no redis.url).
func ExampleWorker() {
	cfg, err := worker.ParseConfig([]byte(`
redis:
  embedded_addr: 127.0.0.1:16381
tasks:
  report:fetch:
    semaphore: {key: legacy-api, capacity: 5, mode: requeue}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	w, err := worker.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	w.HandleFunc("report:fetch", func(ctx context.Context, t *asynq.Task) error {
		seats, _ := w.Semaphore().UsedPermits(ctx, "legacy-api")
		fmt.Printf("fetching %s holding %d of 5 seats\n", t.Payload(), seats)
		stop() // one task is enough for the example
		return nil
	})

	client := asynq.NewClient(asynq.RedisClientOpt{Addr: "127.0.0.1:16381"})
	defer client.Close()
	if _, err := client.Enqueue(asynq.NewTask("report:fetch", []byte(`{"tenant_id":"acme"}`))); err != nil {
		fmt.Println(err)
		return
	}
	if err := w.Run(ctx); err != nil {
		fmt.Println(err)
	}
	// Output:
	// fetching {"tenant_id":"acme"} holding 1 of 5 seats
}
