package asynqx_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/asynqx"
	"github.com/fleetcap/fleetcap/internal/rediskey"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
)

// These tests pin what package asynqx assumes of asynq's internals against
// the asynq that go.mod requires. When one fails after an upgrade, read
// the new asynq's internal/rdb/rdb.go and processor.go, mend asynqx, and
// only then move PinnedVersion.

func TestPinnedVersion(t *testing.T) {
	goMod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(goMod)) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == "github.com/hibiken/asynq" {
			if f[1] != asynqx.PinnedVersion {
				t.Fatalf("go.mod requires asynq %s, but package asynqx was written and tested against %s: "+
					"check every assumption it makes (its doc comment lists them), then update PinnedVersion",
					f[1], asynqx.PinnedVersion)
			}
			return
		}
	}
	t.Fatal("go.mod does not require github.com/hibiken/asynq")
}

// mark is the text a task sent back to wait for a seat of "k" holds in
// its message (fleetcap's requeue message; see Wake).
const mark = `fleetcap: waiting for seat of "k"`

// seam is an asynq client, inspector and raw Redis client on a private
// redis-server.
type seam struct {
	t      *testing.T
	srv    *redistest.Server
	rdb    *redis.Client
	client *asynq.Client
	insp   *asynq.Inspector
}

func newSeam(t *testing.T) *seam {
	srv := redistest.Start(t)
	conn := asynq.RedisClientOpt{Addr: srv.Addr()}
	s := &seam{t: t, srv: srv, rdb: srv.Client(), client: asynq.NewClient(conn), insp: asynq.NewInspector(conn)}
	t.Cleanup(func() { _ = s.client.Close(); _ = s.insp.Close() })
	return s
}

// blockedIn counts the clients of the seam's Redis blocked in cmd now
// (blmove: a worker on duty; blpop: one waiting on the doorbell), -1 when
// Redis fails.
func (s *seam) blockedIn(cmd string) int {
	clients, err := s.rdb.ClientList(context.Background()).Result()
	if err != nil {
		return -1
	}
	n := 0
	for _, c := range strings.Split(clients, "\n") {
		if strings.Contains(c, " cmd="+cmd+" ") && strings.Contains(c, " flags=b ") {
			n++
		}
	}
	return n
}

// serve runs an asynq server with handler h on queue "q" until the test
// ends; failures are not failures when notFailure says so.
func (s *seam) serve(h asynq.HandlerFunc, logger asynq.Logger) {
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: s.srv.Addr()}, asynq.Config{
		Concurrency:              1,
		Queues:                   map[string]int{"q": 1},
		TaskCheckInterval:        10 * time.Millisecond,
		DelayedTaskCheckInterval: time.Hour, // nothing comes back by itself
		IsFailure:                func(err error) bool { return !strings.Contains(err.Error(), "waiting for seat") },
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return time.Hour },
		Logger:                   logger,
		LogLevel:                 asynq.WarnLevel,
		ShutdownTimeout:          time.Second,
	})
	if err := srv.Start(h); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(srv.Shutdown)
}

// enqueue adds a task of type "t" with payload to queue "q", max_retry 3
// unless opts say otherwise, and returns its ID.
func (s *seam) enqueue(payload string, opts ...asynq.Option) string {
	s.t.Helper()
	info, err := s.client.Enqueue(asynq.NewTask("t", []byte(payload)), append([]asynq.Option{asynq.Queue("q"), asynq.MaxRetry(3)}, opts...)...)
	if err != nil {
		s.t.Fatal(err)
	}
	return info.ID
}

func (s *seam) state(id string) string {
	s.t.Helper()
	state, _, err := asynqx.Task(context.Background(), s.rdb, "q", id)
	if err != nil {
		s.t.Fatal(err)
	}
	return state
}

func (s *seam) waitState(id, want string) {
	s.t.Helper()
	waitfor.Condition(s.t, 10*time.Second, "task "+id+" "+want, func() bool { return s.state(id) == want })
}

// TestStatesAndKeys: asynq keeps a task's state and message in the hash
// QueueKeys(q).TaskPrefix+id, under the state names asynqx reads, and its
// pending, scheduled and retry ids where QueueKeys says.
func TestStatesAndKeys(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	k := asynqx.QueueKeys("q")
	pending, err := s.client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	scheduled, err := s.client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("q"), asynq.ProcessIn(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if st := s.state(pending.ID); st != "pending" {
		t.Fatalf("enqueued task state %q, want pending", st)
	}
	if ids := s.rdb.LRange(ctx, k.Pending, 0, -1).Val(); !slices.Contains(ids, pending.ID) {
		t.Fatalf("pending list %v lacks %s", ids, pending.ID)
	}
	if st := s.state(scheduled.ID); st != "scheduled" {
		t.Fatalf("scheduled task state %q", st)
	}
	if _, err := s.rdb.ZScore(ctx, k.Scheduled, scheduled.ID).Result(); err != nil {
		t.Fatalf("scheduled set lacks %s: %v", scheduled.ID, err)
	}
	if st := s.state("no-such-task"); st != "" {
		t.Fatalf("a missing task has state %q", st)
	}
}

// TestWake: a task that waits for a seat (in the retry set with the
// requeue text in its message, or a copy scheduled with the copy header)
// is brought back and runs before the tasks enqueued before it; a task that
// completed (kept by Retention), was archived, retries after a real
// failure, or is being processed is left alone.
func TestWake(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	const copyHeader = "copied-from"
	var mu sync.Mutex
	var ran []string
	release := make(chan struct{})
	s.serve(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		ran = append(ran, id)
		mu.Unlock()
		switch string(task.Payload()) {
		case "park":
			if retried, _ := asynq.GetRetryCount(ctx); retried == 0 {
				return errors.New(mark + " (full)")
			}
		case "fail":
			return errors.New("a real failure")
		case "archive":
			return fmt.Errorf("bad: %w", asynq.SkipRetry)
		case "block":
			<-release
		}
		return nil
	}, nil)
	enqueue := s.enqueue
	wake := func(id string) asynqx.WakeResult {
		t.Helper()
		res, err := asynqx.Wake(ctx, s.rdb, "q", id, mark, copyHeader)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	parked := enqueue("park")
	s.waitState(parked, "retry")
	done := enqueue("ok", asynq.Retention(time.Hour))
	s.waitState(done, "completed")
	archived := enqueue("archive")
	s.waitState(archived, "archived")
	failed := enqueue("fail")
	s.waitState(failed, "retry")
	scheduledCopy, err := s.client.Enqueue(asynq.NewTaskWithHeaders("t", []byte("ok"), map[string]string{copyHeader: "x"}),
		asynq.Queue("q"), asynq.ProcessIn(time.Hour), asynq.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	plainScheduled := enqueue("ok", asynq.ProcessIn(time.Hour))

	for name, id := range map[string]string{"completed": done, "archived": archived, "failed for real": failed,
		"scheduled (not a copy)": plainScheduled, "missing (deleted)": "no-such-task"} {
		if res := wake(id); res != asynqx.Gone {
			t.Fatalf("%s task: Wake = %v, want Gone", name, res)
		}
	}
	if st := s.state(done); st != "completed" {
		t.Fatalf("completed task moved to %s", st)
	}

	// A task being processed is reported, and left alone.
	busy := enqueue("block")
	s.waitState(busy, "active")
	if res := wake(busy); res != asynqx.Busy {
		t.Fatalf("active task: Wake = %v, want Busy", res)
	}
	// Queue two tasks behind the busy one, then wake the parked task and
	// the copy: they run before those two, which came earlier.
	earlier1, earlier2 := enqueue("ok"), enqueue("ok")
	if res := wake(parked); res != asynqx.Woken {
		t.Fatalf("parked task: Wake = %v, want Woken", res)
	}
	if res := wake(scheduledCopy.ID); res != asynqx.Woken {
		t.Fatalf("scheduled copy: Wake = %v, want Woken", res)
	}
	// A task woken twice (or run by hand) is pending: it stays at the
	// dequeuing end, once.
	if res := wake(parked); res != asynqx.Woken {
		t.Fatalf("a task woken twice: Wake = %v, want Woken", res)
	}
	if n, err := s.rdb.LLen(ctx, asynqx.QueueKeys("q").Pending).Result(); err != nil || n != 4 {
		t.Fatalf("pending holds %d tasks (%v), want 4: the two woken and the two before them", n, err)
	}
	close(release)
	s.waitState(earlier2, "") // done without Retention: deleted
	s.waitState(scheduledCopy.ID, "completed")
	mu.Lock()
	defer mu.Unlock()
	order := ran[slices.Index(ran, busy)+1:]
	pos := func(id string) int { return slices.Index(order, id) }
	if pos(parked) < 0 || pos(scheduledCopy.ID) < 0 || pos(parked) > pos(earlier1) || pos(scheduledCopy.ID) > pos(earlier1) {
		t.Fatalf("after the busy task ran %v; want the woken %s and %s before %s and %s", order, parked, scheduledCopy.ID, earlier1, earlier2)
	}
	for _, id := range []string{done, parked, scheduledCopy.ID} {
		if n := strings.Count(strings.Join(ran, ","), id); n != 1+boolInt(id == parked) {
			t.Fatalf("task %s ran %d times", id, n)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestWakeInAPausedQueue: a waiting task of a paused queue is made pending
// (it runs once the queue resumes) and reported Paused, so that its place
// goes to another task.
func TestWakeInAPausedQueue(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	if err := s.insp.PauseQueue("q"); err != nil {
		t.Fatal(err)
	}
	waiting, err := s.client.Enqueue(asynq.NewTaskWithHeaders("t", nil, map[string]string{"waits": "k"}), asynq.Queue("q"), asynq.ProcessIn(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pending, err := s.client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{waiting.ID, pending.ID} {
		res, err := asynqx.Wake(ctx, s.rdb, "q", id, mark, "waits")
		if err != nil || res != asynqx.Paused {
			t.Fatalf("task %s of a paused queue: Wake = %v, %v; want Paused", id, res, err)
		}
		if st := s.state(id); st != "pending" {
			t.Fatalf("task %s of a paused queue is %s after Wake, want pending", id, st)
		}
	}
}

// TestRecoverExpired: a task that asynq holds active under an expired
// lease goes back to the dequeuing end of its queue, at most maxTimes.
func TestRecoverExpired(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	k := asynqx.QueueKeys("q")
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	s.serve(func(ctx context.Context, task *asynq.Task) error {
		<-release
		return nil
	}, nil)
	info, err := s.client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	s.waitState(info.ID, "active")
	// Its worker stops renewing: the lease in asynq's lease set lapses.
	if err := s.rdb.ZAdd(ctx, k.Lease, redis.Z{Score: float64(time.Now().Add(-time.Minute).Unix()), Member: info.ID}).Err(); err != nil {
		t.Fatal(err)
	}
	ids, err := asynqx.RecoverExpired(ctx, s.rdb, "q", time.Now().Add(-30*time.Second), 1)
	if err != nil || len(ids) != 1 || ids[0] != info.ID {
		t.Fatalf("RecoverExpired = %v, %v; want [%s]", ids, err, info.ID)
	}
	if st := s.state(info.ID); st != "pending" {
		t.Fatalf("recovered task state %q", st)
	}
	if last := s.rdb.LIndex(ctx, k.Pending, -1).Val(); last != info.ID {
		t.Fatalf("recovered task not at the dequeuing end of pending (%q there)", last)
	}
}

// logCapture is an asynq.Logger that keeps the warnings.
type logCapture struct {
	mu    sync.Mutex
	warns []string
}

func (l *logCapture) Debug(...any) {}
func (l *logCapture) Info(...any)  {}
func (l *logCapture) Warn(args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.warns = append(l.warns, fmt.Sprint(args...))
}
func (l *logCapture) Error(...any) {}
func (l *logCapture) Fatal(...any) {}

func (l *logCapture) exhausted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []string
	for _, w := range l.warns {
		if id, ok := asynqx.ExhaustedTaskID(w); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// serveThrough runs an asynq server on a ServerClient of s's Redis until
// the test ends, and returns the client.
func (s *seam) serveThrough(maxIdle time.Duration, h asynq.HandlerFunc, logger asynq.Logger) *asynqx.ServerClient {
	return s.serveSlots(2, maxIdle, h, logger)
}

// serveSlots is serveThrough with slots slots.
func (s *seam) serveSlots(slots int, maxIdle time.Duration, h asynq.HandlerFunc, logger asynq.Logger) *asynqx.ServerClient {
	rdb := redis.NewClient(&redis.Options{Addr: s.srv.Addr(), ContextTimeoutEnabled: true})
	c := asynqx.NewServerClient(rdb, "test:", []string{"q"}, maxIdle, slog.Default())
	srv := asynq.NewServerFromRedisClient(c, asynq.Config{
		Concurrency:              slots,
		Queues:                   map[string]int{"q": 1},
		TaskCheckInterval:        time.Millisecond,
		DelayedTaskCheckInterval: time.Hour,
		IsFailure:                func(err error) bool { return !strings.Contains(err.Error(), "waiting for seat") },
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return time.Hour },
		Logger:                   logger,
		LogLevel:                 asynq.WarnLevel,
		ShutdownTimeout:          time.Second,
	})
	if err := srv.Start(h); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		c.Stop()
		srv.Shutdown()
		_ = rdb.Close()
	})
	return c
}

// TestKeepInsteadOfArchive: a task with no retry left that its handler
// sends back to wait, after Keep, goes to the retry set with its ID and
// retry count and the handler's message, not to the archive; asynq's
// warning before it reads as ExhaustedTaskID expects. A task without Keep
// is archived as asynq does.
func TestKeepInsteadOfArchive(t *testing.T) {
	s := newSeam(t)
	logs := &logCapture{}
	var c *asynqx.ServerClient
	c = s.serveThrough(time.Second, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		if string(task.Payload()) == "keep" {
			c.Keep(id, time.Hour)
		}
		return errors.New("waiting for seat of k")
	}, logs)
	kept, err := s.client.Enqueue(asynq.NewTask("t", []byte("keep")), asynq.Queue("q"), asynq.MaxRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	dropped, err := s.client.Enqueue(asynq.NewTask("t", []byte("other")), asynq.Queue("q"), asynq.MaxRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	s.waitState(kept.ID, "retry")
	s.waitState(dropped.ID, "archived")
	info, err := s.insp.GetTaskInfo("q", kept.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Retried != 0 || info.MaxRetry != 0 || !strings.Contains(info.LastErr, "waiting for seat of k") {
		t.Fatalf("kept task: retried %d of %d, last error %q", info.Retried, info.MaxRetry, info.LastErr)
	}
	q, err := s.insp.GetQueueInfo("q")
	if err != nil {
		t.Fatal(err)
	}
	if q.Archived != 1 {
		t.Fatalf("%d tasks archived, want only the one not kept", q.Archived)
	}
	waitfor.Condition(t, 5*time.Second, "asynq warns before archiving", func() bool {
		return slices.Contains(logs.exhausted(), kept.ID) && slices.Contains(logs.exhausted(), dropped.ID)
	})
}

// TestIdleWaitWakesOnPush: an idle server waits in its ServerClient for
// far longer than it takes a new task to start: the push wakes it.
func TestIdleWaitWakesOnPush(t *testing.T) {
	s := newSeam(t)
	started := make(chan time.Time, 4)
	s.serveThrough(time.Minute, func(ctx context.Context, task *asynq.Task) error {
		started <- time.Now()
		return nil
	}, nil)
	// Let it find the queue empty and wait.
	if _, err := s.client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("q")); err != nil {
		t.Fatal(err)
	}
	<-started
	waitfor.Condition(t, 10*time.Second, "the server waits for work", func() bool { return s.blockedIn("blmove") == 1 })
	enqueued := time.Now()
	if _, err := s.client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("q")); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-started:
		if lag := at.Sub(enqueued); lag > 5*time.Second {
			t.Fatalf("a new task started %s after its enqueue, with the worker idle", lag)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the idle server did not take a new task within 30s (it waits up to a minute)")
	}
}

// TestOneIdleWorkerWatches: of several idle servers on one queue, one
// watches the queue (BLMOVE) and the others wait on its doorbell (BLPOP);
// a push starts its task at once, and the duty passes on, so that the
// next push is seen too: no push wakes the whole fleet.
func TestOneIdleWorkerWatches(t *testing.T) {
	s := newSeam(t)
	const servers = 4
	started := make(chan string, 16)
	for range servers {
		s.serveThrough(time.Minute, func(ctx context.Context, task *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			started <- id
			return nil
		}, nil)
	}
	for round := range 3 {
		waitfor.Condition(t, 10*time.Second, "one server watches, the others wait on the doorbell", func() bool {
			return s.blockedIn("blmove") == 1 && s.blockedIn("blpop") == servers-1
		})
		info, err := s.client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("q"))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case id := <-started:
			if id != info.ID {
				t.Fatalf("round %d: started %s, want %s", round, id, info.ID)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the task did not start within 10s (the servers wait up to a minute)", round)
		}
	}
}

// TestTrickleKeepsTheDuty: an idle worker on duty that picks up tasks one
// at a time asks Redis for its duty about once a second, not once a task:
// within its lease's margin it keeps the duty without asking.
func TestTrickleKeepsTheDuty(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	started := make(chan struct{}, 1)
	s.serveThrough(time.Minute, func(ctx context.Context, task *asynq.Task) error {
		started <- struct{}{}
		return nil
	}, nil)
	watching := func() bool { return s.blockedIn("blmove") == 1 }
	waitfor.Condition(t, 10*time.Second, "the idle worker watches the queue", watching)
	// Every command goes to the slow log, with its arguments.
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", "100000"}} {
		if err := s.rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.rdb.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const tasks = 20
	begun := time.Now()
	for i := range tasks {
		if _, err := s.client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("q")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatalf("task %d did not start within 10s", i)
		}
		waitfor.Condition(t, 10*time.Second, "the worker watches the queue again", watching)
	}
	elapsed := time.Since(begun)
	entries, err := s.rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	takes := 0
	for _, e := range entries {
		if len(e.Args) > 5 && strings.EqualFold(e.Args[0], "evalsha") && strings.HasSuffix(e.Args[3], "duty") && e.Args[5] == "take" {
			takes++
		}
	}
	// Once a second, and a couple more for a duty handed on when the
	// worker was slow to ask for its next task (see saturated).
	if most := 3 + int(elapsed/time.Second); takes > most {
		t.Fatalf("the worker asked for its duty %d times for %d tasks in %s, want at most %d (about once a second)", takes, tasks, elapsed.Round(time.Millisecond), most)
	}
}

// TestMissing: of the tasks it is asked about, Missing names those that
// wait for nothing any more: deleted, completed or archived; not those
// scheduled, retrying, pending or running.
func TestMissing(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	s.serve(func(ctx context.Context, task *asynq.Task) error {
		switch string(task.Payload()) {
		case "retry":
			return errors.New("again")
		case "archive":
			return fmt.Errorf("bad: %w", asynq.SkipRetry)
		case "block":
			<-release
		}
		return nil
	}, nil)
	enqueue := s.enqueue
	retrying := enqueue("retry")
	s.waitState(retrying, "retry")
	completed := enqueue("ok", asynq.Retention(time.Hour))
	s.waitState(completed, "completed")
	archived := enqueue("archive")
	s.waitState(archived, "archived")
	active := enqueue("block")
	s.waitState(active, "active")
	pending := enqueue("ok")
	scheduled := enqueue("ok", asynq.ProcessIn(time.Hour))
	deleted := enqueue("ok", asynq.ProcessIn(time.Hour))
	if err := s.insp.DeleteTask("q", deleted); err != nil {
		t.Fatal(err)
	}
	gone, err := asynqx.Missing(ctx, s.rdb, "q", []string{retrying, completed, archived, active, pending, scheduled, deleted})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(gone)
	want := []string{completed, archived, deleted}
	slices.Sort(want)
	if !slices.Equal(gone, want) {
		t.Fatalf("Missing = %v, want the completed, archived and deleted tasks %v", gone, want)
	}
}

// TestBacklogRingsForHelp: a worker that keeps finding a task each time it
// asks, a backlog growing behind it, rings the doorbell for an idle worker
// again and again (at most one ring waits there), and not only after the
// wait that started its run: its slots may free one at a time, each taken
// at once, so that it never waits, and never hands its duty on. The test
// stands in for the idle worker: it takes each ring off the doorbell.
func TestBacklogRingsForHelp(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	dequeue := s.bareDequeuer()
	k := asynqx.QueueKeys("q")
	bell := rediskey.Idle("test:", "q") + "bell"
	push := func(n int) {
		for range n {
			if err := s.rdb.LPush(ctx, k.Pending, "task").Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := dequeue(); !errors.Is(err, redis.Nil) {
		t.Fatalf("first dequeue of an empty queue: %v, want redis.Nil", err)
	}
	first := make(chan error, 1)
	go func() { first <- dequeue() }() // waits on duty
	waitfor.Condition(t, 10*time.Second, "the worker watches the queue", func() bool { return s.blockedIn("blmove") == 1 })
	push(1)
	if err := <-first; err != nil {
		t.Fatalf("the dequeue woken by a push: %v", err)
	}
	rings := 0
	deadline := time.Now().Add(10 * time.Second)
	for rings < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("a backlog of %d tasks grew behind a worker that never waited, and it rang for help %d times, want 3",
				s.rdb.LLen(ctx, k.Pending).Val(), rings)
		}
		push(2)
		if err := dequeue(); err != nil {
			t.Fatalf("dequeue with a backlog: %v", err)
		}
		// Read before it is taken: a ring of this very dequeue may land at
		// any moment after it.
		waiting, err := s.rdb.LLen(ctx, bell).Result()
		switch {
		case err != nil:
			t.Fatal(err)
		case waiting > 1:
			t.Fatalf("the doorbell holds %d rings, want one at most", waiting)
		case waiting == 0:
			continue
		}
		if err := s.rdb.LPop(ctx, bell).Err(); err != nil {
			t.Fatal(err)
		}
		rings++
	}
}

// TestUntakenRingsBackOff: a worker that keeps finding tasks while no
// other worker is idle (nobody takes its rings) rings less and less often,
// and one ring stays on the doorbell for the next worker to go idle.
func TestUntakenRingsBackOff(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	dequeue := s.bareDequeuer()
	k := asynqx.QueueKeys("q")
	tasks := make([]any, 1000)
	for i := range tasks {
		tasks[i] = "task"
	}
	for range 100 {
		if err := s.rdb.LPush(ctx, k.Pending, tasks...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const backlog = 1500 * time.Millisecond
	for start := time.Now(); time.Since(start) < backlog; {
		if err := dequeue(); err != nil {
			t.Fatalf("dequeue with a backlog: %v", err)
		}
	}
	// Each ring asks the doorbell's length once (duty.lua).
	rings := commandCalls(t, s.rdb, "llen")
	if rings < 2 || rings > 20 {
		t.Fatalf("a worker with a backlog and nobody idle rang %d times in %s, want 2 to 20 (every 10 ms would be 150)", rings, backlog)
	}
	if n := s.rdb.LLen(ctx, rediskey.Idle("test:", "q")+"bell").Val(); n != 1 {
		t.Fatalf("the doorbell holds %d rings, want 1 for the next worker to go idle", n)
	}
}

// commandCalls reads how many times Redis ran cmd since its stats were
// reset, from INFO commandstats.
func commandCalls(t *testing.T, rdb *redis.Client, cmd string) int {
	t.Helper()
	return redistest.CommandCalls(t, rdb)[cmd]
}

// bareDequeuer returns a dequeue of queue "q" through a ServerClient (of
// the fleet "test:", idle for a minute at most) with no asynq server: a
// stand-in for asynq's dequeue script, with its keys, so that the
// ServerClient treats it as one. It pops a task, or fails with redis.Nil.
func (s *seam) bareDequeuer() func() error {
	dequeue := s.bareDequeuerOf("q")
	return func() error { return dequeue("q") }
}

// bareDequeuerOf is bareDequeuer for a ServerClient that serves queues:
// each call dequeues the queue it names.
func (s *seam) bareDequeuerOf(queues ...string) func(queue string) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.srv.Addr()})
	s.t.Cleanup(func() { _ = rdb.Close() })
	c := asynqx.NewServerClient(rdb, "test:", queues, time.Minute, slog.Default())
	s.t.Cleanup(c.Stop)
	return func(queue string) error {
		k := asynqx.QueueKeys(queue)
		return c.Eval(context.Background(), `return redis.call('RPOP', KEYS[1])`, []string{k.Pending, k.Paused, k.Active, k.Lease}).Err()
	}
}

// TestBacklogOfOneQueueOfTwo: asynq asks each queue in turn, so a worker
// with a backlog in one queue finds the other empty between two of its
// tasks; the backlog still rings that queue's doorbell.
func TestBacklogOfOneQueueOfTwo(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	dequeue := s.bareDequeuerOf("quiet", "busy")
	busy := asynqx.QueueKeys("busy")
	bell := rediskey.Idle("test:", "busy") + "bell"
	rings := 0
	for deadline := time.Now().Add(10 * time.Second); rings < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("a backlog in one queue of two rang its doorbell %d times in 10 s, want 3", rings)
		}
		if err := s.rdb.LPush(ctx, busy.Pending, "task", "task").Err(); err != nil {
			t.Fatal(err)
		}
		if err := dequeue("quiet"); !errors.Is(err, redis.Nil) {
			t.Fatalf("dequeue of the empty queue: %v, want redis.Nil", err)
		}
		if err := dequeue("busy"); err != nil {
			t.Fatalf("dequeue with a backlog: %v", err)
		}
		switch err := s.rdb.LPop(ctx, bell).Err(); {
		case err == nil:
			rings++
		case !errors.Is(err, redis.Nil):
			t.Fatal(err)
		}
	}
}

// TestClaim: a task that waits for a seat, handed to the worker's own
// dequeue (Claim), runs in the slot the dequeue frees without passing
// through its queue, once; a task that waits no more is left alone; a task
// of a paused queue, or one no slot is free for, is left for Wake.
func TestClaim(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	const header = "waits"
	var mu sync.Mutex
	ran := map[string]int{}
	release := make(chan struct{})
	c := s.serveThrough(time.Minute, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		ran[id]++
		n := ran[id]
		mu.Unlock()
		switch string(task.Payload()) {
		case "park":
			if n == 1 {
				return errors.New(mark + " (full)")
			}
		case "block":
			<-release
		}
		return nil
	}, nil)
	runs := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return ran[id]
	}
	waiting := func() string {
		t.Helper()
		info, err := s.client.Enqueue(asynq.NewTaskWithHeaders("t", nil, map[string]string{header: "k"}),
			asynq.Queue("q"), asynq.ProcessIn(time.Hour), asynq.Retention(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return info.ID
	}
	// claim asks until a dequeue takes the claim: one that comes while
	// the server is between two waits for work may miss it.
	claim := func(id string) asynqx.WakeResult {
		t.Helper()
		var res asynqx.WakeResult
		waitfor.Condition(t, 10*time.Second, "a dequeue takes the claim of "+id, func() bool {
			var handled bool
			res, handled = c.Claim("q", id, mark, header)
			return handled
		})
		return res
	}
	parked := s.enqueue("park", asynq.Retention(time.Hour))
	s.waitState(parked, "retry")

	for name, id := range map[string]string{"scheduled to wait": waiting(), "sent back to wait": parked} {
		if res := claim(id); res != asynqx.Woken {
			t.Fatalf("%s: Claim = %v, want Woken", name, res)
		}
		s.waitState(id, "completed")
		if n, err := s.rdb.LLen(ctx, asynqx.QueueKeys("q").Pending).Result(); err != nil || n != 0 {
			t.Fatalf("%s: pending holds %d tasks (%v), want none", name, n, err)
		}
	}
	if n := runs(parked); n != 2 {
		t.Fatalf("the task sent back ran %d times, want 2 (its first run sent it back)", n)
	}

	plain := s.enqueue("ok", asynq.ProcessIn(time.Hour))
	for name, id := range map[string]string{"scheduled, not to wait": plain, "missing (deleted)": "no-such-task"} {
		if res := claim(id); res != asynqx.Gone {
			t.Fatalf("%s: Claim = %v, want Gone", name, res)
		}
	}
	if st := s.state(plain); st != "scheduled" {
		t.Fatalf("a task that waits for no seat is %s after Claim, want scheduled", st)
	}

	// Two claims of one task: it runs once. (A claim no dequeue took
	// is asked again; no goroutine may fail the test.)
	twice := waiting()
	results := make(chan asynqx.WakeResult, 2)
	for range 2 {
		go func() {
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				if res, handled := c.Claim("q", twice, mark, header); handled {
					results <- res
					return
				}
			}
			results <- -1
		}()
	}
	got := []asynqx.WakeResult{<-results, <-results}
	if (got[0] == asynqx.Woken) == (got[1] == asynqx.Woken) {
		t.Fatalf("two claims of one task: %v, want one Woken", got)
	}
	s.waitState(twice, "completed")
	if n := runs(twice); n != 1 {
		t.Fatalf("a task claimed twice ran %d times", n)
	}

	// Paused: left for Wake, which makes it pending.
	if err := s.insp.PauseQueue("q"); err != nil {
		t.Fatal(err)
	}
	inPaused := waiting()
	if res, handled := c.Claim("q", inPaused, mark, header); handled {
		t.Fatalf("a task of a paused queue: Claim = %v, handled; want it left for Wake", res)
	}
	if st := s.state(inPaused); st != "scheduled" {
		t.Fatalf("a task of a paused queue is %s after Claim, want scheduled", st)
	}
	if err := s.insp.UnpauseQueue("q"); err != nil {
		t.Fatal(err)
	}

	// No slot free: left for Wake.
	blocks := []string{s.enqueue("block"), s.enqueue("block")}
	for _, id := range blocks {
		s.waitState(id, "active")
	}
	busy := waiting()
	if res, handled := c.Claim("q", busy, mark, header); handled {
		t.Fatalf("no slot free: Claim = %v, handled; want it left for Wake", res)
	}
	if st := s.state(busy); st != "scheduled" {
		t.Fatalf("no slot free: the task is %s after Claim, want scheduled", st)
	}
	close(release)
	if res := claim(busy); res != asynqx.Woken {
		t.Fatalf("once the slots freed: Claim = %v, want Woken", res)
	}
	s.waitState(busy, "completed")
}

// TestClaimPassesTheDutyOn: a worker on duty (watching the idle queue)
// whose last free slot a claimed task takes hands the duty on at once, as
// after a task it dequeued, not only when a push shows it busy: the other
// idle worker watches the queue before anything is pushed, and takes the
// next task.
func TestClaimPassesTheDutyOn(t *testing.T) {
	s := newSeam(t)
	const header = "waits"
	release := make(chan struct{})
	defer close(release)
	started := make(chan string, 4)
	handler := func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		if string(task.Payload()) == "block" {
			<-release
		}
		return nil
	}
	first := s.serveSlots(1, time.Minute, handler, nil)
	waitfor.Condition(t, 10*time.Second, "the first worker watches the queue", func() bool { return s.blockedIn("blmove") == 1 })
	s.serveSlots(1, time.Minute, handler, nil)
	waitfor.Condition(t, 10*time.Second, "the second waits on the doorbell", func() bool { return s.blockedIn("blpop") == 1 })
	info, err := s.client.Enqueue(asynq.NewTaskWithHeaders("t", []byte("block"), map[string]string{header: "k"}),
		asynq.Queue("q"), asynq.ProcessIn(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 10*time.Second, "the first worker claims the task", func() bool {
		res, handled := first.Claim("q", info.ID, mark, header)
		return handled && res == asynqx.Woken
	})
	if id := receive(t, started, "the claimed task's start"); id != info.ID {
		t.Fatalf("started %s, want the claimed %s", id, info.ID)
	}
	waitfor.Condition(t, 10*time.Second, "the second worker takes the duty (both watch the queue: the first's watch lasts its wait)", func() bool {
		return s.blockedIn("blmove") == 2 && s.blockedIn("blpop") == 0
	})
	next := s.enqueue("ok")
	select {
	case id := <-started:
		if id != next {
			t.Fatalf("started %s, want %s", id, next)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a task pushed after the claim did not start within 10s: the saturated worker kept the duty (the other waits up to a minute)")
	}
}

// TestClaimedTaskLeavesTheQueueAlone: a task claimed by the dequeue that
// waited for work costs no dequeue of the (still empty) queue after it:
// the next dequeue waits again at once, and a task pushed then is taken
// by one dequeue.
func TestClaimedTaskLeavesTheQueueAlone(t *testing.T) {
	s := newSeam(t)
	ctx := context.Background()
	const header = "waits"
	// pops counts the dequeues that popped the queue (asynq's dequeue
	// script runs RPOPLPUSH), -1 when Redis fails.
	pops := func() int64 {
		stats, err := s.rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			return -1
		}
		for _, line := range strings.Split(stats, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_rpoplpush:calls="); ok {
				var n int64
				if _, err := fmt.Sscanf(rest, "%d", &n); err != nil {
					return -1
				}
				return n
			}
		}
		return 0
	}
	// A task's handler reads the count as it starts: with one slot, no
	// dequeue runs meanwhile.
	started := make(chan int64, 4)
	c := s.serveSlots(1, time.Minute, func(ctx context.Context, task *asynq.Task) error {
		started <- pops()
		return nil
	}, nil)
	s.enqueue("ok")
	receive(t, started, "the first task's start")
	waitfor.Condition(t, 10*time.Second, "the server waits for work", func() bool { return s.blockedIn("blmove") == 1 })
	info, err := s.client.Enqueue(asynq.NewTaskWithHeaders("t", nil, map[string]string{header: "k"}), asynq.Queue("q"), asynq.ProcessIn(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 10*time.Second, "the server claims the task", func() bool {
		res, handled := c.Claim("q", info.ID, mark, header)
		return handled && res == asynqx.Woken
	})
	atClaimed := receive(t, started, "the claimed task's start")
	// The server's next dequeue waits for work: any pop of the empty queue
	// came before (it pops, finds nothing, then waits).
	waitfor.Condition(t, 10*time.Second, "the next dequeue waits for work", c.WaitsForWork)
	s.enqueue("ok")
	atNext := receive(t, started, "the next task's start")
	if atClaimed < 0 || atNext < 0 {
		t.Fatal("INFO commandstats failed")
	}
	if n := atNext - atClaimed; n != 1 {
		t.Fatalf("%d dequeues popped the queue from the claimed task's start to the next task's, want 1 (the next task's)", n)
	}
}

// receive takes the next value of ch, and fails the test when none comes
// within 10 s.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing within 10s", what)
	}
	var none T
	return none
}
