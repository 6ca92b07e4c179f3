package fleetcap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/monitoring/workermon"
	"github.com/fleetcap/fleetcap/semaphore"
	"github.com/fleetcap/fleetcap/worker"
)

// rateFleetYAML is the config of a fleet of in-process workers with one
// task type "job" declared by decl (indented for tasks.job).
func rateFleetYAML(redisURL string, slots int, decl string) string {
	return fmt.Sprintf(`redis: {url: %q}
worker: {concurrency: %d, shutdown_timeout: 3s, parked_retry: 10s}
monitoring: {addr: "127.0.0.1:0", admin_token: secret}
tasks:
  job:
    max_retry: 3
%s`, redisURL, slots, decl)
}

// enqueueJobs enqueues n tasks of type job through p with payload(i);
// every third has max_retry 0, which a rate limit must not archive either.
func enqueueJobs(t *testing.T, p interface {
	Enqueue(context.Context, string, []byte, ...asynq.Option) (*asynq.TaskInfo, error)
}, n int, payload func(i int) string) {
	t.Helper()
	for i := range n {
		var opts []asynq.Option
		if i%3 == 0 {
			opts = append(opts, asynq.MaxRetry(0))
		}
		if _, err := p.Enqueue(context.Background(), "job", []byte(payload(i)), opts...); err != nil {
			t.Fatal(err)
		}
	}
}

func noneArchivedIn(t *testing.T, srv *redistest.Server) {
	t.Helper()
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr()})
	defer insp.Close()
	info, err := insp.GetQueueInfo("default")
	if err != nil {
		t.Fatal(err)
	}
	if info.Archived != 0 {
		t.Fatalf("%d tasks archived", info.Archived)
	}
}

// rateKey is a rate limit's key as declared, with the payload of task i
// and the key it renders: the producer holds tasks back the same way for a
// plain key and for a template's.
type rateKey struct {
	name, declared, rendered string
	payload                  func(i int) string
}

var rateKeys = []rateKey{
	{"plain", "api", "api", func(i int) string { return fmt.Sprintf(`{"i":%d}`, i) }},
	{"template", "acct:{a}", "acct:x", func(i int) string { return fmt.Sprintf(`{"a":"x","i":%d}`, i) }},
}

// TestRateLimitHoldsFleetWide: three workers of ten slots share a limit of
// 20 tasks a second with a burst of 5, over a backlog of 120 tasks (a third
// with max_retry 0): no window of one second sees more than rate + burst
// starts, the fleet runs within 10% of the rate while the backlog waits,
// every task runs once, none is archived.
func TestRateLimitHoldsFleetWide(t *testing.T) {
	const tasks, rate, burst = 120, 20, 5
	srv := redistest.Start(t)
	yaml := rateFleetYAML(srv.URL(), 10, fmt.Sprintf("    rate_limits: [{key: api, rate: %d, per: 1s, burst: %d}]\n", rate, burst))
	log := newStartLog()
	startWorkers(t, 3, yaml, map[string]asynq.HandlerFunc{"job": log.handler(0, nil)})
	enqueueJobs(t, newProducer(t, yaml, "job"), tasks, func(i int) string { return fmt.Sprintf(`{"i":%d}`, i) })
	waitfor.Condition(t, 60*time.Second, "every task runs", func() bool { return log.done() == tasks })
	starts := log.startsOf("")
	most, got := mostInWindow(starts, time.Second), rateOver(starts, burst)
	t.Logf("%d starts, at most %d in a second, %.1f a second after the burst (rate %d)", len(starts), most, got, rate)
	if most > rate+burst {
		t.Errorf("%d starts in one second: more than rate + burst = %d", most, rate+burst)
	}
	if got < 0.9*rate || got > 1.1*rate {
		t.Errorf("the fleet ran %.1f tasks a second while the backlog waited: not within 10%% of %d", got, rate)
	}
	if twice := log.ranTwice(); len(twice) > 0 {
		t.Errorf("ran more than once: %v", twice)
	}
	noneArchivedIn(t, srv)
}

// TestRateTemplatesDoNotSlowEachOther: a per-tenant template gives every
// tenant its own tokens: two tenants with a backlog each run at their own
// rate at the same time.
func TestRateTemplatesDoNotSlowEachOther(t *testing.T) {
	const perTenant, rate, burst = 40, 10, 2
	srv := redistest.Start(t)
	yaml := rateFleetYAML(srv.URL(), 10, fmt.Sprintf("    rate_limits: [{key: \"tenant:{tenant}\", rate: %d, per: 1s, burst: %d}]\n", rate, burst))
	tenantOf := func(payload []byte) string {
		var p struct{ Tenant string }
		_ = json.Unmarshal(payload, &p)
		return p.Tenant
	}
	log := newStartLog()
	startWorkers(t, 3, yaml, map[string]asynq.HandlerFunc{"job": log.handler(0, tenantOf)})
	enqueueJobs(t, newProducer(t, yaml, "job"), 2*perTenant, func(i int) string { return fmt.Sprintf(`{"tenant":"t%d","i":%d}`, i%2, i) })
	waitfor.Condition(t, 60*time.Second, "every task runs", func() bool { return log.done() == 2*perTenant })
	for _, tenant := range []string{"t0", "t1"} {
		starts := log.startsOf(tenant)
		got := rateOver(starts, burst)
		t.Logf("tenant %s: %d starts, %.1f a second, at most %d in a second", tenant, len(starts), got, mostInWindow(starts, time.Second))
		if got < 0.9*rate || got > 1.1*rate {
			t.Errorf("tenant %s ran %.1f tasks a second beside the other: not within 10%% of its own %d", tenant, got, rate)
		}
		if m := mostInWindow(starts, time.Second); m > rate+burst {
			t.Errorf("tenant %s: %d starts in one second, more than %d", tenant, m, rate+burst)
		}
	}
	noneArchivedIn(t, srv)
}

// TestRateLimitAndCapBothHold: a task type with a cap of 3 and a rate of
// 15 a second: never more than 3 run at once, never more than rate + burst
// start in a second, and the rate, not the cap (3 tasks of 50 ms allow 60
// a second), is what paces the backlog.
func TestRateLimitAndCapBothHold(t *testing.T) {
	const tasks, capacity, rate, burst = 90, 3, 15, 3
	srv := redistest.Start(t)
	yaml := rateFleetYAML(srv.URL(), 10, fmt.Sprintf("    semaphore: {key: api-conns, capacity: %d, ttl: 10s}\n    rate_limits: [{key: api-calls, rate: %d, per: 1s, burst: %d}]\n", capacity, rate, burst))
	log := newStartLog()
	startWorkers(t, 3, yaml, map[string]asynq.HandlerFunc{"job": log.handler(50*time.Millisecond, nil)})
	enqueueJobs(t, newProducer(t, yaml, "job"), tasks, func(i int) string { return fmt.Sprintf(`{"i":%d}`, i) })
	waitfor.Condition(t, 60*time.Second, "every task runs", func() bool { return log.done() == tasks })
	starts := log.startsOf("")
	got := rateOver(starts, burst)
	t.Logf("at most %d at once, at most %d starts in a second, %.1f a second", log.most.Load(), mostInWindow(starts, time.Second), got)
	if m := log.most.Load(); m > capacity {
		t.Errorf("cap exceeded: %d ran at once, capacity %d", m, capacity)
	}
	if m := mostInWindow(starts, time.Second); m > rate+burst {
		t.Errorf("%d starts in one second, more than rate + burst = %d", m, rate+burst)
	}
	if got < 0.9*rate || got > 1.1*rate {
		t.Errorf("%.1f tasks a second: the rate (%d) should pace the backlog", got, rate)
	}
	noneArchivedIn(t, srv)
}

// TestCapOverrideAppliesFleetWide: an operator lowers, pauses and restores
// a cap through one worker's monitoring API; another worker applies each
// change within a second; nothing is lost or archived.
func TestCapOverrideAppliesFleetWide(t *testing.T) {
	const tasks, capacity = 60, 4
	srv := redistest.Start(t)
	yaml := rateFleetYAML(srv.URL(), 6, fmt.Sprintf("    semaphore: {key: api, capacity: %d, ttl: 10s, wait_timeout: 2s}\n", capacity))
	log := newStartLog()
	ws := startWorkers(t, 2, yaml, map[string]asynq.HandlerFunc{"job": log.handler(100*time.Millisecond, nil)})
	api := serveAPI(t, ws[0])
	enqueueJobs(t, newProducer(t, yaml, "job"), tasks, func(i int) string { return fmt.Sprintf(`{"i":%d}`, i) })
	waitfor.Condition(t, 10*time.Second, "the cap is reached", func() bool { return log.running.Load() == capacity })

	// Watch how many run at once from now on, sampled every few ms.
	type sample struct {
		at      time.Time
		running int64
		done    int
	}
	var samples []sample
	watch := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			samples = append(samples, sample{time.Now(), log.running.Load(), log.done()})
		}
	}
	since := func(t0 time.Time) []sample {
		var out []sample
		for _, s := range samples {
			if s.at.After(t0) {
				out = append(out, s)
			}
		}
		return out
	}
	lowered := api.put(t, "/api/semaphores/api/capacity", `{"capacity": 1}`)
	watch(1500 * time.Millisecond)
	for _, s := range since(lowered.Add(time.Second)) {
		if s.running > 1 {
			t.Fatalf("%s after lowering the cap to 1, %d tasks ran at once", s.at.Sub(lowered).Round(time.Millisecond), s.running)
		}
	}
	paused := api.put(t, "/api/semaphores/api/capacity", `{"capacity": 0}`)
	watch(1500 * time.Millisecond)
	later := since(paused.Add(time.Second))
	if len(later) == 0 {
		t.Fatal("no sample after the pause")
	}
	if first, last := later[0], later[len(later)-1]; first.running != 0 || last.done != first.done {
		t.Fatalf("a paused cap still ran tasks a second after the pause: %+v ... %+v", first, last)
	}
	pausedAt := log.done()
	restored := api.del(t, "/api/semaphores/api/capacity")
	waitfor.Condition(t, time.Second, "tasks run again within a second of the restore", func() bool { return log.done() > pausedAt || log.running.Load() > 0 })
	t.Logf("lowered, paused (%d of %d done) and restored; running again %s after the restore", pausedAt, tasks, time.Since(restored).Round(time.Millisecond))
	waitfor.Condition(t, 60*time.Second, "every task runs", func() bool { return log.done() == tasks })
	if twice := log.ranTwice(); len(twice) > 0 {
		t.Errorf("ran more than once: %v", twice)
	}
	noneArchivedIn(t, srv)
}

// TestRestoredTemplateCapLetsOutWhatAProducerParked: an operator pauses a
// template cap (capacity 0 on the template) while a producer enqueues a
// tenant's tasks, which it parks in the rendered key's room, and restores
// it. No worker ever took one of those tasks, so none of them knew the
// room; the producer notes it as it parks the first task in it, and the
// workers' sweep reads the notes: the tasks run within seconds of the
// restore, not at their safety net (parked_retry, 10 s here; a minute by
// default). Before, they waited for it: found pausing and restoring
// tenant:{tenant_id} with the admin API beside the enqueue command.
func TestRestoredTemplateCapLetsOutWhatAProducerParked(t *testing.T) {
	const tasks = 4
	srv := redistest.Start(t)
	yaml := rateFleetYAML(srv.URL(), 4, "    semaphore: {key: \"tenant:{tenant}\", capacity: 1, ttl: 10s}\n")
	log := newStartLog()
	ws := startWorkers(t, 1, yaml, map[string]asynq.HandlerFunc{"job": log.handler(0, nil)})
	api := serveAPI(t, ws[0])
	api.put(t, "/api/semaphores/tenant:%7Btenant%7D/capacity", `{"capacity": 0}`)
	p := newProducer(t, yaml, "job")
	enqueued := time.Now()
	enqueueJobs(t, p, tasks, func(int) string { return `{"tenant":"acme"}` })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	parked := "fleetcap:sem:{tenant:acme}:parked"
	waitfor.Condition(t, 5*time.Second, "the producer parked every task", func() bool {
		return srv.Client().ZCard(context.Background(), parked).Val() == tasks
	})
	if n := log.done() + int(log.running.Load()); n != 0 {
		t.Fatalf("%d tasks ran while the cap was paused", n)
	}
	restored := api.del(t, "/api/semaphores/tenant:%7Btenant%7D/capacity")
	waitfor.Condition(t, 4*time.Second, "every task runs within 4 s of the restore", func() bool { return log.done() == tasks })
	t.Logf("every task ran %s after the restore, %s after the enqueue", time.Since(restored).Round(time.Millisecond), time.Since(enqueued).Round(time.Millisecond))
	noneArchivedIn(t, srv)
}

// adminAPI is a worker's monitoring server, reached with the admin token.
type adminAPI struct{ url string }

// serveAPI serves w's monitoring API (as cmd/worker does) until the test
// ends.
func serveAPI(t *testing.T, w *worker.Worker) adminAPI {
	t.Helper()
	srv, err := workermon.NewServer(w, workermon.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		_ = srv.Shutdown(context.Background()) // closes asynqmon's Redis
	})
	return adminAPI{url: hs.URL}
}

func (a adminAPI) put(t *testing.T, path, body string) time.Time {
	t.Helper()
	return a.do(t, http.MethodPut, path, body)
}

func (a adminAPI) del(t *testing.T, path string) time.Time {
	t.Helper()
	return a.do(t, http.MethodDelete, path, "")
}

// do sends the request and returns when the answer came.
func (a adminAPI) do(t *testing.T, method, path, body string) time.Time {
	t.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s", method, path, resp.Status)
	}
	return time.Now()
}

// TestRateWakeIsPrompt: tasks that found no token are brought back within
// 50 ms of the moment their tokens are due: with one token every 500 ms
// and a backlog, each task starts 500 to 550 ms after the one before it.
func TestRateWakeIsPrompt(t *testing.T) {
	const tasks, interval, slack = 6, 500 * time.Millisecond, 50 * time.Millisecond
	srv := redistest.Start(t)
	yaml := rateFleetYAML(srv.URL(), 4, "    rate_limits: [{key: slow, rate: 2, per: 1s, burst: 1}]\n")
	log := newStartLog()
	startWorkers(t, 2, yaml, map[string]asynq.HandlerFunc{"job": log.handler(0, nil)})
	enqueueJobs(t, newProducer(t, yaml, "job"), tasks, func(i int) string { return fmt.Sprintf(`{"i":%d}`, i) })
	waitfor.Condition(t, 30*time.Second, "every task runs", func() bool { return log.done() == tasks })
	starts := log.startsOf("")
	for i := 1; i < len(starts); i++ {
		gap := starts[i].Sub(starts[i-1])
		t.Logf("start %d: %s after the one before", i, gap.Round(time.Millisecond))
		// The server's clock and ours agree within a millisecond on loopback.
		if gap < interval-5*time.Millisecond || gap > interval+slack {
			t.Errorf("task %d started %s after the one before; its token was due %s after", i, gap.Round(time.Millisecond), interval)
		}
	}
	noneArchivedIn(t, srv)
}

// TestSeveralRateLimitsSpendNothingForATaskThatDoesNotRun: a task type
// with two rate limits (a large budget "a-budget" and a tight "b-calls")
// beside a task type that takes only "b-calls": a task that takes its
// a-budget token and then loses b-calls' token to another task between its
// peek and its take gives the a-budget token back. At the end a-budget has
// spent exactly one token a task of the first type. (Issue 19, defect 9:
// the earlier limit's token was spent.)
func TestSeveralRateLimitsSpendNothingForATaskThatDoesNotRun(t *testing.T) {
	const both, onlyB, budget = 30, 90, 1000
	srv := redistest.Start(t)
	yaml := fmt.Sprintf(`redis: {url: %q}
worker: {concurrency: 10, shutdown_timeout: 3s, parked_retry: 10s}
monitoring: {addr: "127.0.0.1:0"}
tasks:
  both:
    max_retry: 3
    rate_limits:
      - {key: a-budget, rate: 1, per: 1h, burst: %d}
      - {key: b-calls, rate: 60, per: 1s, burst: 1, mode: wait, wait_timeout: 1s}
  only-b:
    max_retry: 3
    rate_limits: [{key: b-calls, rate: 60, per: 1s, burst: 1, mode: wait, wait_timeout: 1s}]
`, srv.URL(), budget)
	log := newStartLog()
	ws := startWorkers(t, 2, yaml, map[string]asynq.HandlerFunc{"both": log.handler(0, nil), "only-b": log.handler(0, nil)})
	p := newProducer(t, yaml, "both", "only-b")
	ctx := context.Background()
	for i := range both + onlyB {
		typ := "only-b"
		if i%4 == 0 {
			typ = "both"
		}
		if _, err := p.Enqueue(ctx, typ, []byte(fmt.Sprintf(`{"i":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Condition(t, 60*time.Second, "every task runs", func() bool { return log.done() == both+onlyB })
	limit := ws[0].Config().Tasks["both"].RateLimits[0].LimitFor("a-budget")
	res, err := ws[0].Limiter().Peek(ctx, "a-budget", limit, 1)
	if err != nil {
		t.Fatal(err)
	}
	if spent := budget - res.Remaining; spent != both {
		t.Errorf("a-budget spent %d tokens for %d tasks that ran", spent, both)
	}
	if twice := log.ranTwice(); len(twice) > 0 {
		t.Errorf("ran more than once: %v", twice)
	}
	noneArchivedIn(t, srv)
}

// TestProducerHoldsBackTasksBeyondTheRate: a producer that enqueues a
// backlog faster than its rate limit (a plain key) lets through holds all
// but the first few back in the limit's room, scheduled, and brings none
// back while no worker runs. Once two workers start, every
// task runs once, at most rate + burst in any second, and each is
// dequeued once, as its token comes due: none is dequeued early to be
// sent back (before, each of the backlog was).
func TestProducerHoldsBackTasksBeyondTheRate(t *testing.T) {
	for _, k := range rateKeys {
		t.Run(k.name, func(t *testing.T) { producerHoldsBackTasksBeyondTheRate(t, k) })
	}
}

func producerHoldsBackTasksBeyondTheRate(t *testing.T, k rateKey) {
	const tasks, rate, burst = 40, 20, 2
	srv := redistest.Start(t)
	yaml := rateFleetYAML(srv.URL(), 10, fmt.Sprintf("    rate_limits: [{key: %q, rate: %d, per: 1s, burst: %d}]\n", k.declared, rate, burst))
	enqueueJobs(t, newProducer(t, yaml, "job"), tasks, k.payload)
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr()})
	defer insp.Close()
	info, err := insp.GetQueueInfo("default")
	if err != nil {
		t.Fatal(err)
	}
	// The burst, and what the rate earned while the 40 were enqueued.
	if info.Pending > burst+2 || info.Pending+info.Scheduled != tasks {
		t.Fatalf("after the enqueue: %d pending and %d scheduled, want at most %d pending and the rest scheduled", info.Pending, info.Scheduled, burst+2)
	}
	held := info.Pending
	// The producer's loop asks for the room's duty at once, and again a
	// DutyLease later, and is told each time that no worker runs: once it
	// asked twice (the duty's TTL went up twice), nothing may have come
	// back.
	sem, err := semaphore.New(srv.Client(), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sem.Close() }()
	duty, last, asks := sem.PacedRooms(false).DutyKey(k.rendered), time.Duration(-2), 0
	took := waitfor.Condition(t, 5*time.Second, "the producer asks for the room twice", func() bool {
		ttl := srv.Client().PTTL(context.Background(), duty).Val()
		if ttl > last {
			asks++
		}
		last = ttl
		return asks >= 2
	})
	t.Logf("the producer asked for the room twice within %s", took.Round(time.Millisecond))
	if info, err = insp.GetQueueInfo("default"); err != nil {
		t.Fatal(err)
	}
	if info.Pending != held {
		t.Fatalf("with no worker running, %d tasks pending, want %d: tasks were brought back for nobody to run", info.Pending, held)
	}

	var mu sync.Mutex
	dequeued := map[string]int{}
	countDequeues := func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			mu.Lock()
			dequeued[id]++
			mu.Unlock()
			return next.ProcessTask(ctx, task)
		})
	}
	log := newStartLog()
	startWorkers(t, 2, yaml, map[string]asynq.HandlerFunc{"job": log.handler(0, nil)}, countDequeues)
	waitfor.Condition(t, 30*time.Second, "every task runs", func() bool { return log.done() == tasks })
	if most := mostInWindow(log.startsOf(""), time.Second); most > rate+burst {
		t.Errorf("%d starts in one second: more than rate + burst = %d", most, rate+burst)
	}
	if twice := log.ranTwice(); len(twice) > 0 {
		t.Errorf("ran more than once: %v", twice)
	}
	mu.Lock()
	defer mu.Unlock()
	var again []string
	for id, n := range dequeued {
		if n > 1 {
			again = append(again, fmt.Sprintf("%s x%d", id, n))
		}
	}
	t.Logf("%d of %d tasks dequeued more than once: %v", len(again), tasks, again)
	// A task sent straight to its queue may find its token taken by one
	// brought back: at most those few go back once.
	if len(again) > held {
		t.Errorf("%d tasks dequeued more than once, want at most the %d sent straight to the queue", len(again), held)
	}
	noneArchivedIn(t, srv)
}

// TestWorkerBringsBackWhatAProducerLeftInARoom: tasks a producer held back
// in a rate limit's room and left there (it closed before their tokens
// were due) are brought back by a worker that starts later, at the
// limit's pace, long before the safety net (parked_retry, 10 s) would
// bring them.
func TestWorkerBringsBackWhatAProducerLeftInARoom(t *testing.T) {
	for _, k := range rateKeys {
		t.Run(k.name, func(t *testing.T) { workerBringsBackWhatAProducerLeftInARoom(t, k) })
	}
}

func workerBringsBackWhatAProducerLeftInARoom(t *testing.T, k rateKey) {
	const tasks, rate, burst = 10, 5, 1
	srv := redistest.Start(t)
	yaml := rateFleetYAML(srv.URL(), 4, fmt.Sprintf("    rate_limits: [{key: %q, rate: %d, per: 1s, burst: %d}]\n", k.declared, rate, burst))
	p := newProducer(t, yaml, "job")
	enqueueJobs(t, p, tasks, k.payload)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	log := newStartLog()
	start := time.Now()
	startWorkers(t, 1, yaml, map[string]asynq.HandlerFunc{"job": log.handler(0, nil)})
	// 10 tasks at 5 a second take 2 s; 6 s leaves room for a slow machine
	// and stays well before parked_retry.
	waitfor.Condition(t, 6*time.Second, "every task runs", func() bool { return log.done() == tasks })
	t.Logf("every task ran %s after the worker started", time.Since(start).Round(time.Millisecond))
	if most := mostInWindow(log.startsOf(""), time.Second); most > rate+burst {
		t.Errorf("%d starts in one second: more than rate + burst = %d", most, rate+burst)
	}
	noneArchivedIn(t, srv)
}

// TestDeletedWaitingTaskDoesNotDelayTheNext: an operator deletes a task
// that waits in a rate limit's room (with asynq's Inspector, as asynqmon
// and the asynq CLI do): the task behind it runs when its token is due,
// not one interval later. At 1 token every 2 s with a burst of 1, A goes
// straight to the queue and takes the token, B and C wait in the room; B
// is deleted; C must start about 2 s after A (within half an interval),
// not 4 s.
func TestDeletedWaitingTaskDoesNotDelayTheNext(t *testing.T) {
	const interval = 2 * time.Second
	srv := redistest.Start(t)
	yaml := rateFleetYAML(srv.URL(), 4, "    rate_limits: [{key: api, rate: 1, per: 2s, burst: 1}]\n")
	log := newStartLog()
	startWorkers(t, 1, yaml, map[string]asynq.HandlerFunc{"job": log.handler(0, nil)})
	p := newProducer(t, yaml, "job")
	var ids []string
	for _, name := range []string{"a", "b", "c"} {
		info, err := p.Enqueue(context.Background(), "job", []byte(fmt.Sprintf(`{"name":%q}`, name)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr()})
	defer insp.Close()
	if err := insp.DeleteTask("default", ids[1]); err != nil {
		t.Fatalf("delete B, which waits in the room (scheduled): %v", err)
	}
	waitfor.Condition(t, 10*time.Second, "A and C run", func() bool { return log.done() == 2 })
	starts := log.startsOf("")
	gap := starts[1].Sub(starts[0])
	t.Logf("C started %s after A", gap.Round(time.Millisecond))
	if gap > interval+interval/2 {
		t.Errorf("C started %s after A, want about %s: the hand-out of the deleted B delayed it", gap.Round(time.Millisecond), interval)
	}
	if twice := log.ranTwice(); len(twice) > 0 {
		t.Errorf("ran more than once: %v", twice)
	}
}

// TestPausedQueueSpendsNoRate: the tasks of a paused queue, parked in a
// rate limit's room ahead of another queue's, do not spend the pace the
// other queue's tasks could use: each hand-out to one of them is taken
// back at once, and its token keeps its arrival (SPEC §2.11, as for a cap's
// places). Once the queue resumes they all run, none archived. Before, the
// room handed each of them a whole interval, so the other queue's tasks
// started after 40 intervals, not at once.
func TestPausedQueueSpendsNoRate(t *testing.T) {
	const held, other, interval = 40, 10, 100 * time.Millisecond
	q := newPausedQueue(t, redistest.Start(t), "    rate_limits: [{key: shared, rate: 10, per: 1s, burst: 1}]", 0)
	p := newProducer(t, q.yaml, "held", "other")
	q.enqueue(t, p, "held", held)
	q.enqueue(t, p, "other", other)
	startWorkers(t, 1, q.yaml, map[string]asynq.HandlerFunc{"held": q.handler, "other": q.handler})
	pace := other * interval
	q.runsBesideThePause(t, other, held, 2*pace+time.Second, pace)
}

// TestTasksOfALostRateRoomComeBackByThemselves: tasks a producer held back
// in a rate limit's room still run, each once, when the room is lost (as
// an upgrade from Redis layout 6 loses its rooms, or a flush): they were
// enqueued scheduled for parked_retry, come back then, and wait anew.
func TestTasksOfALostRateRoomComeBackByThemselves(t *testing.T) {
	const tasks = 30
	srv := redistest.Start(t)
	yaml := strings.Replace(rateFleetYAML(srv.URL(), 10, "    rate_limits: [{key: lost-calls, rate: 20, per: 1s, burst: 2}]\n"),
		"parked_retry: 10s", "parked_retry: 2s, delayed_task_check_interval: 200ms", 1)
	enqueueJobs(t, newProducer(t, yaml, "job"), tasks, func(i int) string { return fmt.Sprintf(`{"i":%d}`, i) })
	ctx := context.Background()
	rooms, err := srv.Client().Keys(ctx, semaphore.DefaultPrefix+"paced:*").Result()
	if err != nil || len(rooms) == 0 {
		t.Fatalf("the rate limit's room after the enqueue: %v, %v", rooms, err)
	}
	if err := srv.Client().Del(ctx, rooms...).Err(); err != nil {
		t.Fatal(err)
	}
	log := newStartLog()
	startWorkers(t, 2, yaml, map[string]asynq.HandlerFunc{"job": log.handler(0, nil)})
	waitfor.Condition(t, 30*time.Second, "every task held back runs", func() bool { return log.done() == tasks })
	if twice := log.ranTwice(); len(twice) > 0 {
		t.Errorf("ran more than once: %v", twice)
	}
	noneArchivedIn(t, srv)
}
