package worker_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/worker"
)

// TestCapsSetInCode: a cap declared with Worker.SetCaps, not in
// config.yaml, holds like one from the config; a bad one is refused with
// the field named and leaves the type as it was.
func TestCapsSetInCode(t *testing.T) {
	srv := redistest.Start(t)
	cfg, err := worker.ParseConfig([]byte(fmt.Sprintf("redis:\n  url: %q\nworker:\n  concurrency: 4\n  shutdown_timeout: 3s\ntasks:\n  slow:\n    max_retry: 3\n", srv.URL())))
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.SetCaps("slow", worker.CapConfig{Key: "in-code", Capacity: -1}); err == nil || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("SetCaps with capacity -1: %v, want an error naming the capacity", err)
	}
	if got := cfg.Tasks["slow"]; len(got.Semaphores) != 0 || got.Semaphore != nil || got.MaxRetry == nil || *got.MaxRetry != 3 {
		t.Fatalf("a refused SetCaps changed the type's declaration: %+v", got)
	}
	const capacity, tasks = 2, 12
	if err := w.SetCaps("slow", worker.CapConfig{Key: "in-code", Capacity: capacity}); err != nil {
		t.Fatal(err)
	}
	var running, most, done atomic.Int64
	w.HandleFunc("slow", func(ctx context.Context, task *asynq.Task) error {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(30 * time.Millisecond)
		running.Add(-1)
		done.Add(1)
		return nil
	})
	serve(t, w)
	client := asynq.NewClient(asynq.RedisClientOpt{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	for range tasks {
		if _, err := client.Enqueue(asynq.NewTask("slow", []byte(`{}`))); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Condition(t, 20*time.Second, "every task runs", func() bool { return done.Load() == tasks })
	if m := most.Load(); m > capacity {
		t.Fatalf("%d tasks ran at once on 4 slots; the cap set in code is %d", m, capacity)
	}
}
