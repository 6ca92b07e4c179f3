// End-to-end tests of the fleet: several probe worker processes (built
// binaries) on one real Redis that the test starts, with an independent
// counter of how many capped tasks run at once.
package fleetcap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/fleettest"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

var probeBin, enqueueBin, workerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fleetcap-probe-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	probeBin, err = fleettest.Build(dir, raceBuild)
	if err == nil {
		enqueueBin, err = fleettest.BuildCommand(dir, "github.com/fleetcap/fleetcap/cmd/enqueue", false)
	}
	if err == nil {
		workerBin, err = fleettest.BuildCommand(dir, "github.com/fleetcap/fleetcap/cmd/worker", raceBuild)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// fleet is a running fleet of probe workers on a private Redis.
type fleet struct {
	t        *testing.T
	srv      *redistest.Server
	config   string
	env      []string // of every probe worker add starts
	flags    []string
	procs    []*fleettest.Proc
	client   *asynq.Client
	insp     *asynq.Inspector
	counters *fleettest.Counters
}

func startFleet(t *testing.T, n, concurrency int, capYAML string) *fleet {
	t.Helper()
	return startFleetConfig(t, n, func(redisURL string) string { return fleettest.Config(redisURL, concurrency, capYAML) })
}

// startFleetConfig starts n probe workers on a private redis-server with the
// config that config writes for its URL.
func startFleetConfig(t *testing.T, n int, config func(redisURL string) string) *fleet {
	t.Helper()
	srv := redistest.Start(t)
	cfg, err := fleettest.WriteConfig(t.TempDir(), config(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, srv: srv, config: cfg}
	conn := asynq.RedisClientOpt{Addr: srv.Addr()}
	f.client = asynq.NewClient(conn)
	f.insp = asynq.NewInspector(conn)
	t.Cleanup(func() { _ = f.client.Close(); _ = f.insp.Close() })
	f.counters = fleettest.NewCounters(srv.Client(), "probe")
	for i := range n {
		f.add(fmt.Sprintf("w%d", i))
	}
	return f
}

func (f *fleet) add(name string) *fleettest.Proc {
	f.t.Helper()
	return f.addWith(name, f.env, f.config, f.flags...)
}

// addWith starts a probe worker with its own config, extra environment and
// flags.
func (f *fleet) addWith(name string, env []string, config string, flags ...string) *fleettest.Proc {
	f.t.Helper()
	p, err := fleettest.StartEnv(env, probeBin, name, config, flags...)
	if err != nil {
		f.t.Fatal(err)
	}
	f.procs = append(f.procs, p)
	f.t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			f.t.Errorf("%s: %v", name, err)
		}
		if f.t.Failed() {
			f.t.Logf("%s log:\n%s", name, p.Log())
		}
	})
	return p
}

// enqueue adds n probes of ms milliseconds; every fifth has max_retry 0
// (no retry to spend: a full semaphore must still not archive it).
func (f *fleet) enqueue(n, ms int) {
	f.t.Helper()
	for i := range n {
		payload, _ := json.Marshal(map[string]any{"ms": ms})
		opts := []asynq.Option{asynq.MaxRetry(3)}
		if i%5 == 0 {
			opts = []asynq.Option{asynq.MaxRetry(0)}
		}
		if _, err := f.client.Enqueue(asynq.NewTask("probe", payload), opts...); err != nil {
			f.t.Fatal(err)
		}
	}
}

// procsAlive fails when a worker that should run has exited.
func (f *fleet) procsAlive(except ...*fleettest.Proc) func() error {
	return func() error {
		for _, p := range f.procs {
			skip := false
			for _, e := range except {
				skip = skip || p == e
			}
			if !skip && p.Exited() {
				return fmt.Errorf("%s exited: %s", p.Name, p.Log())
			}
		}
		return nil
	}
}

// check asserts the cap held (and was reached), every task finished, and
// none was archived.
func (f *fleet) check(ctx context.Context, tasks, capacity int) {
	f.t.Helper()
	peak, err := f.counters.MaxInflight(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	if peak > capacity {
		f.t.Fatalf("cap exceeded: %d tasks ran at once, capacity %d", peak, capacity)
	}
	if peak < capacity {
		f.t.Fatalf("seats left idle: at most %d of %d ran at once", peak, capacity)
	}
	done, err := f.counters.Done(ctx)
	if err != nil || done != tasks {
		f.t.Fatalf("%d of %d tasks done (%v)", done, tasks, err)
	}
	info, err := f.insp.GetQueueInfo("default")

	if err != nil {
		f.t.Fatal(err)
	}
	if info.Archived != 0 {
		archived, _ := f.insp.ListArchivedTasks("default")
		for _, a := range archived {
			f.t.Logf("archived %s: %s", a.ID, a.LastErr)
		}
		f.t.Fatalf("%d tasks archived", info.Archived)
	}
}

// semHolders returns a function listing the task IDs holding seats of key.
func (f *fleet) semHolders(t *testing.T, key string) func() []string {
	s, err := semaphore.New(f.srv.Client(), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return func() []string {
		hs, err := s.Holders(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, h := range hs {
			ids = append(ids, h.Label)
		}
		return ids
	}
}

func intersect(a, b []string) []string {
	var out []string
	for _, x := range a {
		for _, y := range b {
			if x == y {
				out = append(out, x)
			}
		}
	}
	return out
}

func capYAML(mode string, capacity int, ttl string) string {
	return fmt.Sprintf("    semaphore:\n      key: probe-cap\n      capacity: %d\n      mode: %s\n      ttl: %s\n      wait_timeout: 2s\n", capacity, mode, ttl)
}

func TestFleetCapHolds(t *testing.T) {
	for _, mode := range []string{"requeue", "wait"} {
		t.Run(mode, func(t *testing.T) {
			const tasks, capacity = 90, 3
			f := startFleet(t, 3, 6, capYAML(mode, capacity, "10s"))
			ctx := context.Background()
			f.enqueue(tasks, 20)
			if err := f.counters.WaitDone(ctx, tasks, 90*time.Second, f.procsAlive()); err != nil {
				t.Fatal(err)
			}
			f.check(ctx, tasks, capacity)
		})
	}
}

// TestFleetSpareSeatsHoldTheCap: a cap of 12 on a fleet of 18 slots. Fed
// a few tasks at a time, it is far from full, so the workers take spare
// seats (semaphore Options.SpareSeats) and lend them to their tasks in
// memory; then a burst fills it: the spare seats are called back, the cap
// holds and is reached, every task runs once, and none is archived.
//
// The burst's tasks last 40 ms: "reached" means that all 12 ran at one
// instant, and with 10 ms tasks a slow machine's hand-overs (a few ms
// each under -race) left some seat between two tasks at every instant of
// the burst now and then (CI: at most 11 of 12), with no seat held back.
func TestFleetSpareSeatsHoldTheCap(t *testing.T) {
	const capacity, trickle, burst, burstMS = 12, 40, 200, 40
	f := startFleet(t, 3, 6, capYAML("requeue", capacity, "10s"))
	ctx := context.Background()
	sem, err := semaphore.New(f.srv.Client(), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	sawSpare := false
	// runUntil waits for n tasks done, sampling the holders of the cap.
	runUntil := func(n int) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			done, err := f.counters.Done(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if done >= n {
				return
			}
			if err := f.procsAlive()(); err != nil {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d tasks done within 90s", done, n)
			}
			holders, err := sem.Holders(ctx, "probe-cap")
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range holders {
				sawSpare = sawSpare || strings.HasPrefix(h.Label, "spare:")
			}
			time.Sleep(2 * time.Millisecond) // a sampling interval, not a wait for an outcome
		}
	}
	for i := range trickle / 4 {
		f.enqueue(4, 10)
		runUntil(4 * (i + 1))
	}
	if !sawSpare {
		t.Error("no worker held spare seats of a cap of 12 fed 4 tasks at a time")
	}
	f.enqueue(burst, burstMS)
	runUntil(trickle + burst)
	f.check(ctx, trickle+burst, capacity)
	if runs, err := f.counters.Runs(ctx); err != nil || runs != trickle+burst {
		t.Fatalf("%d runs of %d tasks (%v): a task ran twice or not at all", runs, trickle+burst, err)
	}
}

// TestFleetSurvivesSIGKILL kills a worker that holds seats mid-run: its
// seats lapse within their TTL, asynq recovers its tasks, every task
// completes and the cap holds.
func TestFleetSurvivesSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for asynq's recoverer (about a minute)")
	}
	const tasks, capacity = 30, 3
	// The victim starts alone, so that the seats it takes are surely its own.
	f := startFleet(t, 1, 4, capYAML("requeue", capacity, "2s"))
	ctx := context.Background()
	f.enqueue(tasks, 300)
	victim := f.procs[0]
	holders := f.semHolders(t, "probe-cap")
	var held []string
	deadline := time.Now().Add(30 * time.Second)
	for len(held) == 0 {
		held = holders()
		if time.Now().After(deadline) {
			t.Fatal("the victim never took a seat")
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.add("w1")
	f.add("w2")
	victim.Kill()
	start := time.Now()
	// The killed probes never count themselves out: do it for them, while
	// their seats still keep anyone else from starting.
	if n, err := f.counters.Forget(ctx, victim.PID()); err != nil || n == 0 {
		t.Fatalf("count out the killed probes: %d, %v", n, err)
	}
	// Its seats lapse within their TTL (2s), though nobody released them.
	for len(intersect(holders(), held)) > 0 {
		if time.Since(start) > 3*time.Second {
			t.Fatalf("seats of the killed worker still held %s after the kill (TTL 2s)", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the killed worker's seats lapsed %s after the kill", time.Since(start).Round(time.Millisecond))
	// Its tasks come back to the queue (worker/recover.go) long before
	// asynq's own recoverer would bring them (60-120 s).
	var recovered time.Duration
	for _, id := range held {
		for {
			info, err := f.insp.GetTaskInfo("default", id)
			if err != nil || info.State != asynq.TaskStateActive {
				break
			}
			if time.Since(start) > 60*time.Second {
				t.Fatalf("task %s of the killed worker still active %s after the kill", id, time.Since(start).Round(time.Second))
			}
			time.Sleep(50 * time.Millisecond)
		}
		recovered = time.Since(start)
	}
	t.Logf("the killed worker's %d tasks were recovered %s after the kill (asynq alone: 60-120 s)", len(held), recovered.Round(100*time.Millisecond))
	if err := f.counters.WaitDone(ctx, tasks, 4*time.Minute, f.procsAlive(victim)); err != nil {
		t.Fatal(err)
	}
	t.Logf("all tasks done %s after the SIGKILL", time.Since(start).Round(time.Second))
	f.check(ctx, tasks, capacity)
}

// TestFleetGracefulSIGTERM stops a worker mid-run: it exits 0 within its
// shutdown timeout, and nothing is lost.
func TestFleetGracefulSIGTERM(t *testing.T) {
	const tasks, capacity = 40, 3
	for _, mode := range []string{"requeue", "wait"} {
		t.Run(mode, func(t *testing.T) {
			f := startFleet(t, 3, 4, capYAML(mode, capacity, "10s"))
			ctx := context.Background()
			f.enqueue(tasks, 150)
			if err := f.counters.WaitDone(ctx, 5, 30*time.Second, f.procsAlive()); err != nil {
				t.Fatal(err)
			}
			leaving := f.procs[0]
			if err := leaving.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := leaving.Wait(10 * time.Second); err != nil {
				t.Fatalf("graceful shutdown: %v\n%s", err, leaving.Log())
			}
			if err := f.counters.WaitDone(ctx, tasks, 60*time.Second, f.procsAlive(leaving)); err != nil {
				t.Fatal(err)
			}
			f.check(ctx, tasks, capacity)
		})
	}
}

// TestWakeRunsATaskOnce: on a contended cap, tasks that were parked come
// back by themselves after their retry delay and run, while releases keep
// waking parked tokens; with Retention every completed task stays in
// Redis. A wake-up must only bring back a task that still waits for that
// seat: every task runs exactly once, none is archived, and the parked
// line holds at most one token per task still waiting. (The audit saw 23 of
// 64 tasks run twice: a stale token moved a completed task back to its
// queue.)
func TestWakeRunsATaskOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 64 tasks of 250 ms one at a time")
	}
	const tasks, capacity = 64, 1
	// Parked tasks come back by themselves after 2 s, while releases keep
	// letting their tokens out.
	f := startFleetConfig(t, 3, func(redisURL string) string {
		return strings.Replace(fleettest.Config(redisURL, 4, capYAML("requeue", capacity, "10s")), "worker:\n", "worker:\n  parked_retry: 2s\n", 1)
	})
	ctx := context.Background()
	for range tasks {
		payload, _ := json.Marshal(map[string]any{"ms": 250})
		if _, err := f.client.Enqueue(asynq.NewTask("probe", payload), asynq.MaxRetry(3), asynq.Retention(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	parked := f.srv.Client()
	parkedKey := semaphore.DefaultPrefix + "{probe-cap}:parked"
	mostParked := 0
	tokensBounded := func() error {
		if err := f.procsAlive()(); err != nil {
			return err
		}
		done, err := f.counters.Done(ctx)
		if err != nil {
			return err
		}
		n, err := parked.ZCard(ctx, parkedKey).Result()
		if err != nil {
			return err
		}
		mostParked = max(mostParked, int(n))
		if int(n) > tasks-done {
			return fmt.Errorf("%d tokens parked with %d tasks left to run", n, tasks-done)
		}
		return nil
	}
	if err := f.counters.WaitDone(ctx, tasks, 3*time.Minute, tokensBounded); err != nil {
		t.Fatal(err)
	}
	// A task brought back by a stale token would run again now: wait until
	// nothing is left to run, then count the runs.
	waitfor.Condition(t, 30*time.Second, "the queue settles", func() bool {
		info, err := f.insp.GetQueueInfo("default")
		return err == nil && info.Pending+info.Active+info.Retry+info.Scheduled == 0
	})
	runs, err := f.counters.Runs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d runs of %d tasks; at most %d tokens parked", runs, tasks, mostParked)
	if runs != tasks {
		t.Fatalf("%d runs of %d tasks: a wake-up ran a finished task again", runs, tasks)
	}
	f.check(ctx, tasks, capacity)
}
