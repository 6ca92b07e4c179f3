// The producer's routing of new capped tasks, with a worker taking them.
package fleetcap_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
)

// TestParkedWithoutAskingRunsWhenTheCapIsFree: within a second of a cap
// refusing a place, the producer parks the next tasks of its key without
// asking for a place (producer's TestBacklogAsksAFullCapOnce). When the
// cap went free meanwhile, such a task is let out by its own park and runs
// at once, not after worker.parked_retry (a minute here).
func TestParkedWithoutAskingRunsWhenTheCapIsFree(t *testing.T) {
	srv := redistest.Start(t)
	yaml := fmt.Sprintf(`redis: {url: %q}
worker: {concurrency: 4, shutdown_timeout: 3s, parked_retry: 1m}
monitoring: {addr: "127.0.0.1:0"}
tasks:
  job:
    semaphore: {key: quick, capacity: 1, standby: 0, ttl: 10s}
`, srv.URL())
	var mu sync.Mutex
	ended := map[string]time.Time{}
	started := map[string]time.Time{}
	startWorkers(t, 1, yaml, map[string]asynq.HandlerFunc{"job": func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		started[id] = time.Now()
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		ended[id] = time.Now()
		mu.Unlock()
		return nil
	}})
	p := newProducer(t, yaml, "job")
	ctx := context.Background()
	enqueue := func(id string) time.Time {
		t.Helper()
		if _, err := p.Enqueue(ctx, "job", []byte(`{}`), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	enqueue("a")
	refusedAt := enqueue("b") // the seat's place is a's: b is refused one, and parked
	waitfor.Condition(t, 10*time.Second, "a and b ran", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !ended["a"].IsZero() && !ended["b"].IsZero()
	})
	at := enqueue("c")
	if since := at.Sub(refusedAt); since > time.Second {
		t.Logf("c came %s after b's refusal: it asked for a place, the case is not exercised", since)
	}
	waitfor.Condition(t, 10*time.Second, "c runs on the free cap (not after parked_retry)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !started["c"].IsZero()
	})
}
