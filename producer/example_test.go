package producer_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/admission"
	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/producer"
	"github.com/fleetcap/fleetcap/tasks"
)

// exampleConfig is the fleet's config.yaml for the examples: the private
// Redis of the tests, and report:fetch as the shipped config.yaml declares
// it.
func exampleConfig() *config.Config {
	cfg, err := config.ParseConfig(fmt.Appendf(nil, `
redis: {url: "redis://%s"}
worker:
  queues: {default: 1, critical: 5}
tasks:
  report:fetch:
    max_retry: 10
    timeout: 5m
    semaphore: {key: legacy-api, capacity: 5}
`, redisAddr))
	if err != nil {
		panic(err)
	}
	return cfg
}

// A Go service enqueues report:fetch tasks for the fleet: every task type
// the config declares can be enqueued, and a validator adds a payload
// check to one. Each task gets the queue, max_retry and timeout that the
// config gives report:fetch, and carries the trace context of its producer
// span to the worker.
func ExampleProducer_Enqueue() {
	cfg := exampleConfig() // or config.LoadConfig("config.yaml")
	ctx := context.Background()

	p, err := producer.New(cfg, producer.WithValidator(tasks.TypeReportFetch, func(payload []byte) error {
		_, err := tasks.DecodeReportFetch(payload) // as the handler decodes it
		return err
	}))
	if err != nil {
		panic(err)
	}
	defer p.Close()

	info, err := p.Enqueue(ctx, tasks.TypeReportFetch, []byte(`{"tenant_id":"acme"}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(info.Queue, info.MaxRetry, info.Timeout)

	// A payload the handler would reject is never enqueued.
	_, err = p.Enqueue(ctx, tasks.TypeReportFetch, []byte(`{"tenant":"acme"}`))
	fmt.Println(errors.Is(err, producer.ErrInvalid), err)

	// Nor is a task of a type the config does not declare.
	_, err = p.Enqueue(ctx, "report:fetsh", []byte(`{"tenant_id":"acme"}`))
	fmt.Println(errors.Is(err, producer.ErrInvalid), err)
	// Output:
	// default 10 5m0s
	// true invalid report:fetch payload: unknown field "tenant"
	// true unknown task type "report:fetsh": the config declares report:fetch
}

// EnqueueAll checks every payload before it enqueues the first; asynq's
// options override the configured ones.
func ExampleProducer_EnqueueAll() {
	p, err := producer.New(exampleConfig())
	if err != nil {
		panic(err)
	}
	defer p.Close()
	ctx := context.Background()

	payloads := [][]byte{[]byte(`{"tenant_id":"acme"}`), []byte(`{"tenant_id":"globex"}`)}
	for info, err := range p.EnqueueAll(ctx, tasks.TypeReportFetch, payloads, asynq.Queue("critical")) {
		if err != nil {
			fmt.Println(err)
			break
		}
		fmt.Println("enqueued on", info.Queue)
	}
	// Output:
	// enqueued on critical
	// enqueued on critical
}

// A cap with max_waiting bounds the tasks that may wait for its key: once
// that many wait, Enqueue refuses the next with ErrFull, and the caller
// can shed the load or try again later. Here no worker takes the tasks:
// the first holds the cap's one standby place, the second waits in Redis.
func ExampleErrFull() {
	cfg, err := config.ParseConfig(fmt.Appendf(nil, `
redis: {url: "redis://%s"}
tasks:
  export:run:
    semaphore: {key: "exports-%s", capacity: 1, max_waiting: 2}
`, redisAddr, uuid.NewString())) // a key of its own: the example's Redis is shared
	if err != nil {
		panic(err)
	}
	p, err := producer.New(cfg)
	if err != nil {
		panic(err)
	}
	defer p.Close()
	ctx := context.Background()

	for range 3 {
		_, err := p.Enqueue(ctx, "export:run", []byte(`{}`))
		var full *admission.FullError
		switch {
		case errors.Is(err, producer.ErrFull) && errors.As(err, &full):
			fmt.Printf("refused: %d wait, max_waiting %d\n", full.Waiting, full.MaxWaiting)
		case err != nil:
			panic(err)
		default:
			fmt.Println("enqueued")
		}
	}
	// Output:
	// enqueued
	// enqueued
	// refused: 2 wait, max_waiting 2
}
