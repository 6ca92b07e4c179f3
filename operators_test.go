// What operators do to waiting tasks with asynq's own tools (SPEC §2.11):
// delete, archive, run by hand and pause, through asynq.Inspector (which
// the asynq CLI and asynqmon call), on tasks that wait for a full cap in
// every place a task can wait: scheduled by the producer, in retry after
// going back, and pending with a standby place.
package fleetcap_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/producer"
	"github.com/fleetcap/fleetcap/semaphore"
)

// operatorFleet is one worker with a cap of 2 on a private Redis, a
// producer, a plain asynq client and an Inspector, and the record of which
// task started when.
type operatorFleet struct {
	t        *testing.T
	srv      *redistest.Server
	yaml     string
	insp     *asynq.Inspector
	client   *asynq.Client
	dur      time.Duration
	capacity int

	mu     sync.Mutex
	starts map[string][]time.Time // task ID -> its starts
	order  []string               // task IDs in the order they started
}

const operatorTaskDur = 200 * time.Millisecond

// newOperatorFleet's worker has concurrency slots.
func newOperatorFleet(t *testing.T, concurrency int) *operatorFleet {
	t.Helper()
	srv := redistest.Start(t)
	f := &operatorFleet{t: t, srv: srv, dur: operatorTaskDur, capacity: 2, starts: map[string][]time.Time{}}
	f.yaml = fmt.Sprintf(`redis: {url: %q}
worker: {concurrency: %d, shutdown_timeout: 3s}
monitoring: {addr: "127.0.0.1:0"}
tasks:
  capped:
    max_retry: 3
    semaphore: {key: scarce, capacity: %d, ttl: 10s, wait_timeout: 5s}
`, srv.URL(), concurrency, f.capacity)
	conn := asynq.RedisClientOpt{Addr: srv.Addr()}
	f.insp = asynq.NewInspector(conn)
	f.client = asynq.NewClient(conn)
	t.Cleanup(func() { _ = f.insp.Close(); _ = f.client.Close() })
	return f
}

// start runs the worker until the test ends.
func (f *operatorFleet) start() {
	f.t.Helper()
	startWorkers(f.t, 1, f.yaml, map[string]asynq.HandlerFunc{"capped": func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		f.mu.Lock()
		f.starts[id] = append(f.starts[id], time.Now())
		f.order = append(f.order, id)
		f.mu.Unlock()
		time.Sleep(f.dur)
		return nil
	}})
}

// produce enqueues n capped tasks through the producer, in order.
func (f *operatorFleet) produce(n int) []string {
	f.t.Helper()
	p := newProducer(f.t, f.yaml, "capped")
	ids := make([]string, n)
	for i := range n {
		info, err := p.Enqueue(context.Background(), "capped", []byte(fmt.Sprintf(`{"n":%d}`, i)))
		if err != nil {
			f.t.Fatal(err)
		}
		ids[i] = info.ID
	}
	return ids
}

// enqueuePlain enqueues n capped tasks with plain asynq: they reach the
// worker, find the cap full and go back to the retry set to wait.
func (f *operatorFleet) enqueuePlain(n int) []string {
	f.t.Helper()
	ids := make([]string, n)
	for i := range n {
		info, err := f.client.Enqueue(asynq.NewTask("capped", []byte(fmt.Sprintf(`{"n":%d}`, i))), asynq.MaxRetry(3))
		if err != nil {
			f.t.Fatal(err)
		}
		ids[i] = info.ID
	}
	return ids
}

// state is the asynq state of a task ("" when it does not exist).
func (f *operatorFleet) state(id string) string {
	info, err := f.insp.GetTaskInfo("default", id)
	if err != nil {
		return ""
	}
	return info.State.String()
}

// inState waits until n of ids are in state, and returns the first n of
// them by the order of ids.
func (f *operatorFleet) inState(ids []string, state string, n int) []string {
	f.t.Helper()
	var got []string
	waitfor.Condition(f.t, 20*time.Second, fmt.Sprintf("%d tasks %s", n, state), func() bool {
		got = got[:0]
		for _, id := range ids {
			if f.state(id) == state {
				got = append(got, id)
			}
		}
		return len(got) >= n
	})
	return got[:n]
}

func (f *operatorFleet) ranOnce(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.starts[id]) == 1
}

// finish waits for every task of want to run, at the cap's pace from now,
// and checks that each ran once and that none of gone ran.
func (f *operatorFleet) finish(want, gone []string) {
	f.t.Helper()
	left := 0
	for _, id := range want {
		if !f.ranOnce(id) {
			left++
		}
	}
	pace := time.Duration(left) * f.dur / time.Duration(f.capacity)
	limit := 2*pace + 3*time.Second
	took := waitfor.Condition(f.t, limit, fmt.Sprintf("the %d tasks left run at the cap's pace (%s)", left, pace), func() bool {
		for _, id := range want {
			if !f.ranOnce(id) {
				return false
			}
		}
		return true
	})
	f.t.Logf("%d tasks left ran in %s (the cap's pace: %s)", left, took.Round(time.Millisecond), pace)
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, s := range f.starts {
		if len(s) > 1 {
			f.t.Errorf("task %s ran %d times", id, len(s))
		}
	}
	for _, id := range gone {
		if len(f.starts[id]) > 0 {
			f.t.Errorf("task %s ran after it was removed", id)
		}
	}
	f.roomEmpty()
}

// roomEmpty checks that the cap's waiting room keeps nothing once every
// task ran: no token, no place, no arrival.
func (f *operatorFleet) roomEmpty() {
	f.t.Helper()
	rdb := f.srv.Client()
	waitfor.Condition(f.t, 5*time.Second, "the waiting room of scarce is empty", func() bool {
		n, err := rdb.Exists(context.Background(), "fleetcap:sem:{scarce}:parked", "fleetcap:sem:{scarce}:places",
			"fleetcap:sem:{scarce}:waiting", "fleetcap:sem:{scarce}:slots").Result()
		return err == nil && n == 0
	})
}

// remove deletes or archives the tasks of ids through the Inspector, and
// returns those it removed. The tasks are the next to be woken, so one may
// be woken and start before its turn to be removed: asynq refuses to
// remove an active task, and that one is left to run, as an operator's
// would be. At least half of ids must be removed.
func (f *operatorFleet) remove(action string, ids []string) []string {
	f.t.Helper()
	var removed []string
	for _, id := range ids {
		var err error
		switch action {
		case "delete":
			err = f.insp.DeleteTask("default", id)
		case "archive":
			err = f.insp.ArchiveTask("default", id)
		}
		switch state := f.state(id); {
		case err == nil:
			removed = append(removed, id)
		case state == "active" || state == "completed":
			f.t.Logf("%s task %s: it started meanwhile (%s): %v", action, id, state, err)
		default:
			f.t.Fatalf("%s task %s (%s): %v", action, id, state, err)
		}
	}
	if len(removed) < (len(ids)+1)/2 {
		f.t.Fatalf("%d of %d tasks removed: too few to tell", len(removed), len(ids))
	}
	return removed
}

func without(ids, gone []string) []string {
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(gone, id) })
}

// TestRemovedWaitingTasksGiveBackTheirPlaces: tasks that wait for a full
// cap, deleted or archived with asynq's tools, take nothing of the cap
// with them: the tasks left run at the cap's pace, each once, and the
// waiting room is empty at the end. (Issue 19, defect 1: a deleted task's
// token kept coming back to the head of the line and its place lapsed
// back to it, 30 s at a time: a cap of 2 ran 5 tasks in 30 s.)
func TestRemovedWaitingTasksGiveBackTheirPlaces(t *testing.T) {
	for _, action := range []string{"delete", "archive"} {
		t.Run(action+" scheduled by the producer", func(t *testing.T) {
			f := newOperatorFleet(t, 10)
			f.start()
			ids := f.produce(20)
			gone := f.remove(action, f.inState(ids, "scheduled", 6)) // the next ones to be woken
			f.finish(without(ids, gone), gone)
		})
		t.Run(action+" in retry after going back", func(t *testing.T) {
			f := newOperatorFleet(t, 10)
			f.start()
			ids := f.enqueuePlain(20)
			gone := f.remove(action, f.inState(ids, "retry", 6))
			f.finish(without(ids, gone), gone)
		})
		t.Run(action+" pending with a standby place", func(t *testing.T) {
			// Before any worker serves, the producer keeps a place for
			// the first tasks and sends them to their queue; the others
			// wait scheduled.
			f := newOperatorFleet(t, 10)
			ids := f.produce(12)
			gone := f.remove(action, f.inState(ids, "pending", 2))
			f.start()
			f.finish(without(ids, gone), gone)
		})
	}
}

// TestRunByHandKeepsItsPlace: waiting tasks run by hand (asynq task run)
// go to their queue before their turn, and keep their place in arrival
// order: no task that came after one of them starts before it, beyond the
// tasks already in flight. The worker's slots are as many as the seats and
// standby places, so that they wait in their queue while the tasks let out
// before them run (two more for the tasks a plain client enqueued, which
// must reach a slot to go back to wait). (Issue 19, defect 2: a task let
// out while it waited in its queue lost its place, and ran last.)
func TestRunByHandKeepsItsPlace(t *testing.T) {
	for _, where := range []string{"scheduled", "retry"} {
		t.Run(where, func(t *testing.T) {
			slots := 2 * 2
			if where == "retry" {
				slots += 2 // to send the tasks the plain client enqueued back to wait
			}
			f := newOperatorFleet(t, slots)
			f.start()
			var ids []string
			if where == "scheduled" {
				ids = f.produce(24)
			} else {
				ids = f.enqueuePlain(24)
			}
			byHand := f.inState(ids, where, 10)
			for _, id := range byHand {
				if err := f.insp.RunTask("default", id); err != nil {
					t.Fatalf("run task %s: %v", id, err)
				}
			}
			f.finish(ids, nil)
			f.mu.Lock()
			defer f.mu.Unlock()
			// Tasks in flight when they were run (running, standing by or
			// on their way) may start before them, in any order.
			slack := 2 * f.capacity
			var seq, hand []int
			for _, id := range f.order {
				seq = append(seq, slices.Index(ids, id))
			}
			for _, id := range byHand {
				hand = append(hand, slices.Index(ids, id))
			}
			t.Logf("starts, by arrival: %v; run by hand: %v", seq, hand)
			for _, id := range byHand {
				at := slices.Index(ids, id)
				overtaken := 0
				for _, started := range f.order[:slices.Index(f.order, id)] {
					if slices.Index(ids, started) > at {
						overtaken++
					}
				}
				if overtaken > slack {
					t.Errorf("task %d (run by hand) started after %d tasks that came after it (at most %d may)", at, overtaken, slack)
				}
			}
		})
	}
}

// pausedQueue is a fleet's config whose task types held and other, in
// queues of their names, share a limit, declared by decl under each; the
// queue held is paused. Its handler records the types that ran.
type pausedQueue struct {
	yaml string
	insp *asynq.Inspector
	dur  time.Duration // each task's run

	mu  sync.Mutex
	ran map[string]int // by task type
}

func newPausedQueue(t *testing.T, srv *redistest.Server, decl string, dur time.Duration) *pausedQueue {
	t.Helper()
	q := &pausedQueue{yaml: fmt.Sprintf(`redis: {url: %q}
worker: {concurrency: 10, shutdown_timeout: 3s, parked_retry: 10s, queues: {held: 1, other: 1}}
monitoring: {addr: "127.0.0.1:0"}
tasks:
  held:
    queue: held
    max_retry: 0
%[2]s
  other:
    queue: other
    max_retry: 0
%[2]s
`, srv.URL(), decl), insp: asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr()}), dur: dur, ran: map[string]int{}}
	t.Cleanup(func() { _ = q.insp.Close() })
	if err := q.insp.PauseQueue("held"); err != nil {
		t.Fatal(err)
	}
	return q
}

func (q *pausedQueue) handler(_ context.Context, task *asynq.Task) error {
	q.mu.Lock()
	q.ran[task.Type()]++
	q.mu.Unlock()
	time.Sleep(q.dur)
	return nil
}

func (q *pausedQueue) count(typ string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.ran[typ]
}

// enqueue enqueues n tasks of typ through p.
func (q *pausedQueue) enqueue(t *testing.T, p *producer.Producer, typ string, n int) {
	t.Helper()
	for i := range n {
		if _, err := p.Enqueue(context.Background(), typ, []byte(fmt.Sprintf(`{"n":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
}

// runsBesideThePause waits for other's n tasks to run within limit while
// held waits paused, checks that none of held ran, resumes held and waits
// for its held tasks to run, none archived.
func (q *pausedQueue) runsBesideThePause(t *testing.T, other, held int, limit, pace time.Duration) {
	t.Helper()
	took := waitfor.Condition(t, limit, "the other queue's tasks run while held waits paused", func() bool {
		return q.count("other") == other
	})
	t.Logf("the other queue's %d tasks ran in %s (the limit's pace: %s, %d paused tasks waiting)", other, took.Round(time.Millisecond), pace, held)
	if n := q.count("held"); n != 0 {
		t.Errorf("%d tasks of the paused queue ran", n)
	}
	if err := q.insp.UnpauseQueue("held"); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 30*time.Second, "the paused queue's tasks run once it resumes", func() bool {
		return q.count("held") == held
	})
	for _, name := range []string{"held", "other"} {
		info, err := q.insp.GetQueueInfo(name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Archived != 0 {
			t.Errorf("queue %s: %d archived", name, info.Archived)
		}
	}
}

// TestPausedQueueHoldsNoPlaces: the tasks of a paused queue hold no seat
// and no standby place of a cap that another queue's tasks could use
// (SPEC §2.11); once the queue resumes they run.
func TestPausedQueueHoldsNoPlaces(t *testing.T) {
	srv := redistest.Start(t)
	q := newPausedQueue(t, srv, "    semaphore: {key: scarce, capacity: 2, ttl: 10s, wait_timeout: 5s}", operatorTaskDur)
	p := newProducer(t, q.yaml, "held", "other")
	q.enqueue(t, p, "held", 4)
	startWorkers(t, 1, q.yaml, map[string]asynq.HandlerFunc{"held": q.handler, "other": q.handler})
	q.enqueue(t, p, "other", 10)
	// The paused queue's tasks, first in line, step aside as their turn
	// comes: the room's reading (what /api/semaphores shows) counts them
	// aside, not waiting.
	sem, err := semaphore.New(srv.Client(), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sem.Close() }()
	waitfor.Condition(t, 10*time.Second, "the paused queue's 4 tasks stand aside", func() bool {
		st, err := sem.RoomStats(context.Background(), "scarce")
		return err == nil && st.Aside == 4
	})
	pace := 10 * operatorTaskDur / 2
	q.runsBesideThePause(t, 10, 4, 2*pace+3*time.Second, pace)
}
