package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/layout"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/worker"
)

// prefixedFleet declares, for a fleet of its own semaphore.prefix, a task
// type on the fleet's queue under a cap and a rate limit whose keys every
// fleet uses; every fleet also serves the queue "idle", where nothing is
// enqueued: its workers stay idle on it.
const prefixedFleet = `
redis: {url: %q}
worker: {concurrency: 2, queues: {%s: 1, idle: 1}, shutdown_timeout: 3s}
semaphore: {prefix: %q}
tasks:
  job:
    queue: %[2]s
    semaphore: {key: shared, capacity: 1}
    rate_limits: [{key: api, rate: 2, per: 1h, burst: 2}]
`

// fleet is one running worker of a prefixedFleet.
type fleet struct {
	prefix, queue string
	w             *worker.Worker
	ran           chan string // the payloads of the jobs it ran
}

func startFleet(t *testing.T, srv *redistest.Server, prefix, queue string) *fleet {
	t.Helper()
	cfg, err := worker.ParseConfig(fmt.Appendf(nil, prefixedFleet, srv.URL(), queue, prefix))
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{prefix: prefix, queue: queue, w: w, ran: make(chan string, 10)}
	w.HandleFunc("job", func(ctx context.Context, task *asynq.Task) error {
		f.ran <- string(task.Payload())
		return nil
	})
	serve(t, w)
	return f
}

// runs enqueues a job on the fleet's queue and wants the fleet to run it
// within 10 s.
func (f *fleet) runs(t *testing.T, client *asynq.Client, payload string) {
	t.Helper()
	if _, err := client.Enqueue(asynq.NewTask("job", []byte(payload)), asynq.Queue(f.queue)); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-f.ran:
		if got != payload {
			t.Fatalf("fleet %s ran %q, want %q", f.prefix, got, payload)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("fleet %s did not run %q within 10s (held back by another fleet's cap, override or tokens?)", f.prefix, payload)
	}
}

// TestFleetsWithDifferentPrefixesShareARedis: two fleets whose configs set
// different semaphore.prefix values, on one Redis, with the same cap and
// rate-limit keys, see nothing of each other: not the rate limit's tokens
// (of two tokens an hour, each fleet has two), not the operators'
// overrides (one fleet's pause leaves the other running), not the watches
// of idle queues (each fleet has a worker on duty on the queue both
// serve). Every key on the Redis, but asynq's and the layout record, is
// under one fleet's prefix.
func TestFleetsWithDifferentPrefixesShareARedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	a := startFleet(t, srv, "fleetA:", "qa")
	b := startFleet(t, srv, "fleetB:", "qb")
	client := asynq.NewClient(asynq.RedisClientOpt{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })

	// Tokens: each fleet takes one of the two tokens of its own limit.
	a.runs(t, client, "a1")
	b.runs(t, client, "b1")
	limit := ratelimit.Limit{Rate: 2, Per: time.Hour, Burst: 2}
	for _, f := range []*fleet{a, b} {
		if res, err := f.w.Limiter().Peek(ctx, "api", limit, 1); err != nil || res.Remaining != 1 {
			t.Errorf("fleet %s: %+v, %v; want 1 token left of 2, one taken by its job", f.prefix, res, err)
		}
	}

	// Overrides: fleet A's operator pauses the cap, and raises the rate.
	store := a.w.Overrides().Store()
	if err := store.SetCapacity(ctx, "shared", 0); err != nil {
		t.Fatal(err)
	}
	if err := store.SetRate(ctx, "api", ratelimit.Limit{Rate: 100, Per: time.Second, Burst: 100}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*fleet{a, b} {
		if err := f.w.Overrides().Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if c, over := a.w.Overrides().CapacityFor("shared", "", 1); c != 0 || !over {
		t.Errorf("fleet A: capacity %d (override %v), want its own pause", c, over)
	}
	if o := b.w.Overrides().Overrides(); len(o.Capacities) != 0 || len(o.Rates) != 0 {
		t.Errorf("fleet B reads fleet A's overrides: %+v", o)
	}
	if b.w.Overrides().Store().Key() == store.Key() {
		t.Errorf("both fleets keep their overrides in %s", store.Key())
	}
	b.runs(t, client, "b2") // its cap is not paused, and its second token is its own

	// Idle watches: each fleet has a worker on duty on "idle".
	for _, f := range []*fleet{a, b} {
		duty := f.prefix + "idle:{idle}:duty"
		waitfor.Condition(t, 10*time.Second, "fleet "+f.prefix+" has a worker on duty on queue idle ("+duty+")", func() bool {
			return rdb.Exists(ctx, duty).Val() == 1
		})
	}

	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, "asynq:"), k == layout.Key:
		case strings.HasPrefix(k, "fleetA:"), strings.HasPrefix(k, "fleetB:"),
			strings.HasPrefix(k, "rate:fleetA:"), strings.HasPrefix(k, "rate:fleetB:"):
		default:
			t.Errorf("Redis key %q is under neither fleet's prefix", k)
		}
	}
}
