package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
	"github.com/fleetcap/fleetcap/worker"
)

// testWorker runs a worker on a private redis-server with the given task
// declarations, until the test ends.
type testWorker struct {
	t      *testing.T
	srv    *redistest.Server
	w      *worker.Worker
	client *asynq.Client
	insp   *asynq.Inspector
	obs    *recorder
}

func newTestWorker(t *testing.T, tasksYAML string, handlers map[string]asynq.HandlerFunc) *testWorker {
	t.Helper()
	srv := redistest.Start(t)
	cfg := testConfig(t, srv, tasksYAML)
	obs := &recorder{}
	w, err := worker.New(cfg, worker.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	for typ, h := range handlers {
		w.Handle(typ, h)
	}
	tw := &testWorker{t: t, srv: srv, w: w, obs: obs}
	conn := asynq.RedisClientOpt{Addr: srv.Addr()}
	tw.client, tw.insp = asynq.NewClient(conn), asynq.NewInspector(conn)
	t.Cleanup(func() {
		_ = tw.client.Close()
		_ = tw.insp.Close()
	})
	serve(t, w)
	return tw
}

// testConfig is the config of a test worker on srv: concurrency 4, a
// shutdown of 3s, and the task declarations tasksYAML (indented under
// tasks:).
func testConfig(t *testing.T, srv *redistest.Server, tasksYAML string) *worker.Config {
	t.Helper()
	cfg, err := worker.ParseConfig([]byte(fmt.Sprintf("redis:\n  url: %q\nworker:\n  concurrency: 4\n  shutdown_timeout: 3s\ntasks:\n%s", srv.URL(), tasksYAML)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// serve runs w until the test ends, then stops it and wants Run to return
// no error.
func serve(t *testing.T, w *worker.Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func (tw *testWorker) enqueue(typ, payload string, opts ...asynq.Option) string {
	tw.t.Helper()
	info, err := tw.client.Enqueue(asynq.NewTask(typ, []byte(payload)), opts...)
	if err != nil {
		tw.t.Fatal(err)
	}
	return info.ID
}

func (tw *testWorker) sem() *semaphore.Service {
	s, err := semaphore.New(tw.srv.Client(), semaphore.Options{})
	if err != nil {
		tw.t.Fatal(err)
	}
	tw.t.Cleanup(func() { _ = s.Close() })
	return s
}

// recorder is an Observer that remembers what it was told.
type recorder struct {
	mu        sync.Mutex
	requeued  []string // key/why
	leaseLost []string
	waiting   map[string]int // key -> slots waiting now
}

func (r *recorder) Acquire(semaphore.AcquireEvent) {}
func (r *recorder) Release(semaphore.ReleaseEvent) {}
func (r *recorder) Lost(string)                    {}
func (r *recorder) ActiveChanged(string, int)      {}
func (r *recorder) Waiting(key string, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting == nil {
		r.waiting = map[string]int{}
	}
	r.waiting[key] += delta
}
func (r *recorder) LeaseLost(key, taskType string) { r.add(&r.leaseLost, key) }
func (r *recorder) Requeued(key, taskType, why string) {
	r.add(&r.requeued, key+"/"+why)
}

func (r *recorder) add(list *[]string, s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*list = append(*list, s)
}

func (r *recorder) waitingNow(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiting[key]
}

func (r *recorder) count(list *[]string, s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range *list {
		if x == s {
			n++
		}
	}
	return n
}

// TestFullSemaphoreNeverArchives: with every seat taken by someone else,
// tasks with retries, with max_retry 0 and on their last retry are requeued
// (not archived), and all run once a seat frees.
func TestFullSemaphoreNeverArchives(t *testing.T) {
	var ran sync.Map
	tw := newTestWorker(t, `  job:
    max_retry: 2
    semaphore: {key: api, capacity: 1, mode: requeue, ttl: 30s, standby: 0}
`, map[string]asynq.HandlerFunc{"job": func(ctx context.Context, task *asynq.Task) error {
		ran.Store(string(task.Payload()), true)
		return nil
	}})
	ctx := context.Background()
	blocker, err := tw.sem().Acquire(ctx, "api", 1)
	if err != nil {
		t.Fatal(err)
	}
	tw.enqueue("job", "retries-left")
	tw.enqueue("job", "no-retry", asynq.MaxRetry(0))
	waitfor.Condition(t, 10*time.Second, "both requeued while the seat is taken", func() bool {
		return tw.obs.count(&tw.obs.requeued, "api/full") >= 2
	})
	info, err := tw.insp.GetQueueInfo("default")
	if err != nil {
		t.Fatal(err)
	}
	if info.Archived != 0 {
		t.Fatalf("%d archived while the semaphore was full", info.Archived)
	}
	if err := blocker.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The release was not the worker's Service (it admits no tokens), so
	// the worker's sweep of the rooms it knows lets the parked tasks out.
	waitfor.Condition(t, 30*time.Second, "both tasks ran", func() bool {
		_, a := ran.Load("retries-left")
		_, b := ran.Load("no-retry")
		return a && b
	})
	info, err = tw.insp.GetQueueInfo("default")
	if err != nil {
		t.Fatal(err)
	}
	if info.Archived != 0 || info.Retry != 0 {
		t.Fatalf("archived %d, retry %d after all ran", info.Archived, info.Retry)
	}
}

// TestReleaseWakesParked: a task parked for a full semaphore runs as soon as
// the worker's own task releases the seat, not after the safety-net delay.
func TestReleaseWakesParked(t *testing.T) {
	var order []string
	var mu sync.Mutex
	release := make(chan struct{})
	tw := newTestWorker(t, `  job:
    semaphore: {key: api, capacity: 1, mode: requeue, standby: 0}
`, map[string]asynq.HandlerFunc{"job": func(ctx context.Context, task *asynq.Task) error {
		mu.Lock()
		order = append(order, string(task.Payload()))
		mu.Unlock()
		if string(task.Payload()) == "first" {
			<-release
		}
		return nil
	}})
	tw.enqueue("job", "first")
	waitfor.Condition(t, 10*time.Second, "first runs", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 1 })
	tw.enqueue("job", "second")
	waitfor.Condition(t, 10*time.Second, "second parked", func() bool { return tw.obs.count(&tw.obs.requeued, "api/full") == 1 })
	start := time.Now()
	close(release)
	waitfor.Condition(t, 5*time.Second, "second runs after the release", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 2 })
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("parked task ran %s after the release: it waited for the safety net, not the wake-up", d)
	}
}

// TestPayloadThatCannotRenderItsKey is archived with a clear message and
// never runs uncapped.
func TestPayloadThatCannotRenderItsKey(t *testing.T) {
	var ran atomic.Int32
	tw := newTestWorker(t, `  job:
    semaphore: {key: "tenant:{tenant_id}", capacity: 1}
`, map[string]asynq.HandlerFunc{"job": func(ctx context.Context, task *asynq.Task) error {
		ran.Add(1)
		return nil
	}})
	id := tw.enqueue("job", `{"other": 1}`)
	waitfor.Condition(t, 10*time.Second, "task archived", func() bool {
		info, err := tw.insp.GetTaskInfo("default", id)
		return err == nil && info.State == asynq.TaskStateArchived
	})
	info, _ := tw.insp.GetTaskInfo("default", id)
	if !strings.Contains(info.LastErr, "tenant_id") {
		t.Fatalf("archived with %q: want a message naming tenant_id", info.LastErr)
	}
	if ran.Load() != 0 {
		t.Fatal("the handler ran without its cap")
	}
}

// TestHolderIsTheTaskID: the worker records the task ID as the seat's holder.
func TestHolderIsTheTaskID(t *testing.T) {
	running := make(chan string, 1)
	finish := make(chan struct{})
	tw := newTestWorker(t, `  job:
    semaphore: {key: api, capacity: 2}
`, map[string]asynq.HandlerFunc{"job": func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		running <- id
		<-finish
		return nil
	}})
	defer close(finish)
	tw.enqueue("job", "x")
	id := <-running
	hs, err := tw.sem().Holders(context.Background(), "api")
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || hs[0].Label != id {
		t.Fatalf("holders %+v, want task %s", hs, id)
	}
}

// TestLeaseLost: when the seat is lost while the task runs, on_lease_lost
// cancel cancels the handler's context and the task runs again (not counted
// as a failure); continue lets it finish.
func TestLeaseLost(t *testing.T) {
	for _, policy := range []string{"cancel", "continue"} {
		t.Run(policy, func(t *testing.T) {
			var runs atomic.Int32
			cancelled := make(chan struct{}, 2)
			started := make(chan struct{}, 2)
			tw := newTestWorker(t, fmt.Sprintf(`  job:
    max_retry: 0
    semaphore: {key: api, capacity: 1, ttl: 300ms, auto_renew: true, on_lease_lost: %s}
`, policy), map[string]asynq.HandlerFunc{"job": func(ctx context.Context, task *asynq.Task) error {
				n := runs.Add(1)
				started <- struct{}{}
				if n > 1 {
					return nil
				}
				select {
				case <-ctx.Done():
					cancelled <- struct{}{}
					return ctx.Err()
				case <-time.After(1500 * time.Millisecond):
					return nil
				}
			}})
			id := tw.enqueue("job", "x", asynq.MaxRetry(0))
			<-started
			if _, err := tw.sem().ForceReleaseAll(context.Background(), "api"); err != nil {
				t.Fatal(err)
			}
			waitfor.Condition(t, 5*time.Second, "lease loss noticed", func() bool { return tw.obs.count(&tw.obs.leaseLost, "api") == 1 })
			switch policy {
			case "cancel":
				select {
				case <-cancelled:
				case <-time.After(5 * time.Second):
					t.Fatal("handler context not cancelled after the lease was lost")
				}
				waitfor.Condition(t, 15*time.Second, "task ran again", func() bool { return runs.Load() == 2 })
			case "continue":
				waitfor.Condition(t, 5*time.Second, "task finished", func() bool {
					_, err := tw.insp.GetTaskInfo("default", id)
					return errors.Is(err, asynq.ErrTaskNotFound)
				})
				if len(cancelled) != 0 || runs.Load() != 1 {
					t.Fatalf("continue: cancelled %d, runs %d", len(cancelled), runs.Load())
				}
			}
			info, err := tw.insp.GetQueueInfo("default")
			if err != nil {
				t.Fatal(err)
			}
			if info.Archived != 0 {
				t.Fatalf("%d archived", info.Archived)
			}
		})
	}
}

// TestWaitModeTimesOutAndRequeues: mode wait waits up to wait_timeout, then
// requeues without a failure.
func TestWaitModeTimesOutAndRequeues(t *testing.T) {
	var ran atomic.Int32
	tw := newTestWorker(t, `  job:
    max_retry: 1
    semaphore: {key: api, capacity: 1, mode: wait, wait_timeout: 200ms}
`, map[string]asynq.HandlerFunc{"job": func(ctx context.Context, task *asynq.Task) error {
		ran.Add(1)
		return nil
	}})
	blocker, err := tw.sem().Acquire(context.Background(), "api", 1)
	if err != nil {
		t.Fatal(err)
	}
	id := tw.enqueue("job", "x")
	waitfor.Condition(t, 10*time.Second, "requeued after the wait", func() bool { return tw.obs.count(&tw.obs.requeued, "api/timeout") >= 1 })
	info, err := tw.insp.GetTaskInfo("default", id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Retried != 0 || info.State == asynq.TaskStateArchived {
		t.Fatalf("after a wait timeout: retried %d, state %v (want no retry spent, not archived)", info.Retried, info.State)
	}
	_ = blocker.Release(context.Background())
	waitfor.Condition(t, 30*time.Second, "task ran", func() bool { return ran.Load() == 1 })
}

func TestIsFailureAndRetryDelay(t *testing.T) {
	rq := &worker.RequeueError{Key: "k", Why: "full", Delay: 7 * time.Second}
	wrapped := fmt.Errorf("outer: %w", rq)
	if worker.IsFailure(wrapped) {
		t.Fatal("a requeue counted as a failure")
	}
	if !worker.IsFailure(errors.New("boom")) {
		t.Fatal("a plain error not counted as a failure")
	}
	if d := worker.RetryDelay(3, wrapped, asynq.NewTask("t", nil)); d != 7*time.Second {
		t.Fatalf("requeue delay %s, want 7s", d)
	}
	if d := worker.RetryDelay(1, errors.New("boom"), asynq.NewTask("t", nil)); d <= 0 {
		t.Fatalf("failure delay %s", d)
	}
}

// TestRunStoppedBeforeItServes: a worker told to stop before it reached
// Redis (SIGTERM during start-up) ends without an error.
func TestRunStoppedBeforeItServes(t *testing.T) {
	w, err := worker.New(testConfig(t, redistest.Start(t), ""))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatalf("Run with a context already done = %v, want nil", err)
	}
}

// TestSlotsWaitingCountsATaskUntilItRuns: Observer.Waiting counts a capped
// task in while it stands by in its slot, and out before its handler runs.
func TestSlotsWaitingCountsATaskUntilItRuns(t *testing.T) {
	var obs atomic.Pointer[recorder] // set before the task is enqueued
	seenAtStart := make(chan int, 1)
	tw := newTestWorker(t, `  job:
    semaphore: {key: api, capacity: 1, mode: wait, wait_timeout: 20s}
`, map[string]asynq.HandlerFunc{"job": func(ctx context.Context, task *asynq.Task) error {
		seenAtStart <- obs.Load().waitingNow("api")
		return nil
	}})
	obs.Store(tw.obs)
	blocker, err := tw.sem().Acquire(context.Background(), "api", 1)
	if err != nil {
		t.Fatal(err)
	}
	tw.enqueue("job", "x")
	waitfor.Condition(t, 10*time.Second, "the task counted waiting", func() bool { return tw.obs.waitingNow("api") == 1 })
	if err := blocker.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-seenAtStart:
		if n != 0 {
			t.Errorf("the handler started with %d slots counted waiting for api, want 0", n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the task did not run after the seat was released")
	}
	if n := tw.obs.waitingNow("api"); n != 0 {
		t.Errorf("after the run, %d slots counted waiting, want 0", n)
	}
}
