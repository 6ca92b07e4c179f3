package worker_test

import (
	"fmt"
	"strings"
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
	cfg := testConfig(t, srv, "  slow:\n    max_retry: 3\n")
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
	log := newSeatLog()
	w.Handle("slow", log.handler(30*time.Millisecond))
	serve(t, w)
	client := asynq.NewClient(asynq.RedisClientOpt{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	for i := range tasks {
		if _, err := client.Enqueue(asynq.NewTask("slow", []byte(fmt.Sprintf(`{"n":%d}`, i)))); err != nil {
			t.Fatal(err)
		}
	}
	// Once the last task started, the most that ran at once is known.
	waitfor.Condition(t, 20*time.Second, "every task starts", func() bool { return log.count() == tasks })
	log.check(t, capacity, tasks)
}
