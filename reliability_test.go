// Reliability tests (issue 5): the cap holds, and nothing is lost, when
// Redis restarts, goes away for a while, or is cut off from one worker.
// Every fault is real: redis-server processes stopped and started again, a
// TCP proxy that drops and blackholes connections. The probes count
// themselves in a Redis that the fault does not touch.
package fleetcap_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/fleettest"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/tcpproxy"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/semaphore"
)

// newFleet starts n probe workers with config, whose probes count
// themselves in counters (nil: in srv), with conn as the test's own asynq
// connection.
func newFleet(t *testing.T, srv *redistest.Server, conn asynq.RedisConnOpt, config string, counters *redistest.Server, n int, env ...string) *fleet {
	t.Helper()
	path, err := fleettest.WriteConfig(t.TempDir(), config)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, srv: srv, config: path, env: env}
	f.client = asynq.NewClient(conn)
	f.insp = asynq.NewInspector(conn)
	t.Cleanup(func() { _ = f.client.Close(); _ = f.insp.Close() })
	if counters == nil {
		counters = srv
	}
	f.counters = fleettest.NewCounters(counters.Client(), "probe")
	f.flags = []string{"--counters", counters.URL()}
	for i := range n {
		f.add(fmt.Sprintf("w%d", i))
	}
	return f
}

// cpuTime is the user+system CPU time a process used so far.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// TestRedisRestart restarts Redis (AOF on) in the middle of a run: workers
// and the enqueuer reconnect by themselves, every task completes, the cap
// holds and nothing is archived.
func TestRedisRestart(t *testing.T) {
	const capacity, before, after = 3, 30, 30
	srv := redistest.Start(t, redistest.Option{"--appendonly", "yes"})
	counters := redistest.Start(t)
	f := newFleet(t, srv, asynq.RedisClientOpt{Addr: srv.Addr()},
		fleettest.Config(srv.URL(), 4, capYAML("requeue", capacity, "5s")), counters, 3)
	ctx := context.Background()
	f.enqueue(before, 200)
	if err := f.counters.WaitDone(ctx, 6, 30*time.Second, f.procsAlive()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	srv.Restart()
	t.Logf("redis restarted in %s", time.Since(start).Round(time.Millisecond))
	// The same client enqueues again: it reconnects by itself.
	f.enqueue(after, 200)
	if err := f.counters.WaitDone(ctx, before+after, 90*time.Second, f.procsAlive()); err != nil {
		t.Fatal(err)
	}
	t.Logf("all %d tasks done %s after the restart", before+after, time.Since(start).Round(time.Millisecond))
	f.check(ctx, before+after, capacity)
	peak, _ := f.counters.MaxInflight(ctx)
	runs, _ := f.counters.Runs(ctx)
	t.Logf("max inflight %d (cap %d), %d runs for %d tasks", peak, capacity, runs, before+after)
}

// TestAcquireFailsWithReasonErrorWhenRedisIsDown: with the store gone,
// Acquire fails with reason "error" and the driver error as its cause, and
// TryAcquire returns an error rather than "full".
func TestAcquireFailsWithReasonErrorWhenRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	sem, err := semaphore.New(srv.Client(), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	ctx := context.Background()
	p, err := sem.Acquire(ctx, "down", 1)
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	start := time.Now()
	_, err = sem.Acquire(ctx, "down", 2, semaphore.WithWaitTimeout(3*time.Second))
	var aerr *semaphore.AcquisitionError
	if !errors.As(err, &aerr) || aerr.Reason != semaphore.ReasonError || aerr.Err == nil {
		t.Fatalf("Acquire with Redis down: %#v (%v); want reason error with a cause", aerr, err)
	}
	t.Logf("Acquire failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	if p2, err := sem.TryAcquire(ctx, "down", 2); err == nil || p2 != nil {
		t.Fatalf("TryAcquire with Redis down: %v, %v; want an error", p2, err)
	}
	if err := p.Release(ctx); err == nil || errors.Is(err, semaphore.ErrPermitNotHeld) {
		t.Fatalf("Release with Redis down: %v; want a store error", err)
	}
}

// TestRedisDown stops Redis for 10 s in the middle of a run: the workers
// neither exit nor spin (bounded log lines and CPU), and once Redis is back
// on the same port every task completes under the cap.
func TestRedisDown(t *testing.T) {
	if testing.Short() {
		t.Skip("keeps Redis down for 10 s")
	}
	const capacity, before, after, outage = 3, 30, 15, 10 * time.Second
	srv := redistest.Start(t, redistest.Option{"--appendonly", "yes"})
	counters := redistest.Start(t)
	f := newFleet(t, srv, asynq.RedisClientOpt{Addr: srv.Addr()},
		fleettest.Config(srv.URL(), 4, capYAML("requeue", capacity, "3s")), counters, 3)
	ctx := context.Background()
	f.enqueue(before, 300)
	if err := f.counters.WaitDone(ctx, 6, 30*time.Second, f.procsAlive()); err != nil {
		t.Fatal(err)
	}
	logLen := make([]int, len(f.procs))
	cpu := make([]time.Duration, len(f.procs))
	for i, p := range f.procs {
		logLen[i] = strings.Count(p.Log(), "\n")
		cpu[i] = cpuTime(t, p.PID())
	}
	srv.Stop()
	start := time.Now()
	if _, err := f.client.Enqueue(asynq.NewTask("probe", []byte(`{"ms":1}`))); err == nil {
		t.Fatal("enqueue with Redis down succeeded")
	}
	for time.Since(start) < outage {
		if err := f.procsAlive()(); err != nil {
			t.Fatalf("during the outage: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	down := time.Since(start)
	var totalLines int
	for i, p := range f.procs {
		lines := strings.Count(p.Log(), "\n") - logLen[i]
		used := cpuTime(t, p.PID()) - cpu[i]
		totalLines += lines
		t.Logf("%s during %s without Redis: %d log lines, %s CPU", p.Name, down.Round(time.Millisecond), lines, used)
		if lines >= 200 {
			t.Errorf("%s logged %d lines in %s without Redis; want < 200:\n%s", p.Name, lines, down, tail(p.Log(), 40))
		}
		if used > down/4 {
			t.Errorf("%s used %s CPU in %s without Redis: it spins", p.Name, used, down)
		}
	}
	srv.StartAgain()
	back := time.Now()
	f.enqueue(after, 300)
	if err := f.counters.WaitDone(ctx, before+after, 120*time.Second, f.procsAlive()); err != nil {
		t.Fatal(err)
	}
	t.Logf("all %d tasks done %s after Redis came back", before+after, time.Since(back).Round(time.Millisecond))
	runs, _ := f.counters.Runs(ctx)
	// A task whose handler finished while Redis was down stays active:
	// asynq v0.26 retries "mark as done" with a context it already
	// cancelled (processor.go markAsDone), so only the recovery of
	// worker/recover.go brings it back, after its asynq lease, and it runs
	// again (at least once, never lost).
	t.Logf("%d finished runs for %d tasks", runs, before+after)
	f.check(ctx, before+after, capacity)
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestPartition cuts one worker off from Redis (a TCP proxy between them)
// for longer than its lease TTL, while its probes hold every seat: its
// leases are lost by their local deadline, its handlers are cancelled,
// another worker takes the seats, and the probes (which honour their
// context and count themselves in Redis directly) never exceed the cap.
func TestPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts a worker off for 5 s and reruns its long tasks")
	}
	const capacity, short = 3, 27
	const ttl, cut = 2 * time.Second, 5 * time.Second
	srv := redistest.Start(t)
	proxy, err := tcpproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	capCfg := fmt.Sprintf("    semaphore:\n      key: probe-cap\n      capacity: %d\n      mode: requeue\n      ttl: %s\n      wait_timeout: 15s\n      on_lease_lost: cancel\n", capacity, ttl)
	f := newFleet(t, srv, asynq.RedisClientOpt{Addr: srv.Addr()}, fleettest.Config(srv.URL(), 3, capCfg), nil, 0)
	viaProxy, err := fleettest.WriteConfig(t.TempDir(), fleettest.Config("redis://"+proxy.Addr(), capacity, capCfg))
	if err != nil {
		t.Fatal(err)
	}
	// The victim starts alone and takes every seat with long probes.
	victim := f.addWith("victim", nil, viaProxy, "--counters", srv.URL())
	ctx := context.Background()
	for range capacity {
		if _, err := f.client.Enqueue(asynq.NewTask("probe", []byte(`{"ms":6000}`)), asynq.MaxRetry(3)); err != nil {
			t.Fatal(err)
		}
	}
	holders := f.semHolders(t, "probe-cap")
	var held []string
	waitfor.Condition(t, 30*time.Second, "the victim takes every seat", func() bool { held = holders(); return len(held) == capacity })
	f.add("w1")
	f.add("w2")
	f.enqueue(short, 200)

	proxy.Cut()
	cutAt := time.Now()
	// The victim's seats lapse on the server within the TTL...
	lapsed := waitfor.Condition(t, ttl+time.Second, "the victim's seats lapse", func() bool { return len(intersect(holders(), held)) == 0 })
	// ...and the other workers take them.
	taken := waitfor.Condition(t, 5*time.Second, "another worker takes a seat", func() bool {
		now := holders()
		return len(now) > 0 && len(intersect(now, held)) == 0
	})
	t.Logf("after the cut: the victim's seats lapsed in %s, another worker held one %s later", lapsed.Round(time.Millisecond), taken.Round(time.Millisecond))
	// The victim learned it by its local deadline, which comes before the
	// server's expiry: it cancelled its handlers within the TTL of the cut
	// (a little slack for the log line to reach us).
	waitfor.Condition(t, max(ttl+300*time.Millisecond-time.Since(cutAt), 0), "the victim cancels its handlers", func() bool {
		return strings.Count(victim.Log(), "lease lost; cancelling the task") >= capacity
	})
	t.Logf("the victim cancelled its %d handlers within %s of the cut", capacity, time.Since(cutAt).Round(time.Millisecond))
	for time.Since(cutAt) < cut {
		if err := f.procsAlive()(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	proxy.Restore()
	restored := time.Now()
	if err := f.counters.WaitDone(ctx, capacity+short, 90*time.Second, f.procsAlive()); err != nil {
		t.Fatal(err)
	}
	t.Logf("all %d tasks done %s after the proxy was restored", capacity+short, time.Since(restored).Round(time.Millisecond))
	peak, _ := f.counters.MaxInflight(ctx)
	runs, _ := f.counters.Runs(ctx)
	t.Logf("max inflight %d (cap %d), %d finished runs for %d tasks; victim log:\n%s", peak, capacity, runs, capacity+short, tail(victim.Log(), 15))
	f.check(ctx, capacity+short, capacity)
}
