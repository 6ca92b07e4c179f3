package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/producer"
	"github.com/fleetcap/fleetcap/worker"
)

// tenantLog records the tenants of the tasks in the order they started,
// the most running at once, and how often each task ran.
type tenantLog struct {
	mu       sync.Mutex
	inflight int
	peak     int
	started  []string
	runs     map[string]int
	doneAt   map[string]time.Time // the last end of each tenant's tasks
	done     map[string]int       // tasks done by tenant
}

func newTenantLog() *tenantLog {
	return &tenantLog{runs: map[string]int{}, doneAt: map[string]time.Time{}, done: map[string]int{}}
}

func (l *tenantLog) handler(d time.Duration) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) error {
		var p struct {
			Tenant string `json:"tenant"`
			N      int    `json:"n"`
		}
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return err
		}
		l.mu.Lock()
		l.inflight++
		l.peak = max(l.peak, l.inflight)
		l.started = append(l.started, p.Tenant)
		l.runs[fmt.Sprintf("%s/%d", p.Tenant, p.N)]++
		l.mu.Unlock()
		time.Sleep(d)
		l.mu.Lock()
		l.inflight--
		l.doneAt[p.Tenant] = time.Now()
		l.done[p.Tenant]++
		l.mu.Unlock()
		return nil
	}
}

func (l *tenantLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.started)
}

// check fails the test when the cap was exceeded or a task ran twice or
// not at all.
func (l *tenantLog) check(t *testing.T, capacity, tasks int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.peak > capacity {
		t.Errorf("%d tasks ran at once, want at most %d", l.peak, capacity)
	}
	for name, n := range l.runs {
		if n != 1 {
			t.Errorf("%s ran %d times", name, n)
		}
	}
	if len(l.runs) != tasks {
		t.Errorf("%d tasks ran, want %d", len(l.runs), tasks)
	}
}

// fairFleet starts 3 workers of a fleet whose fair tasks share a cap of 4
// with fair_by tenant (and weights, if any), and returns a producer.
func fairFleet(t *testing.T, log *tenantLog, weights string) *producer.Producer {
	t.Helper()
	srv := redistest.Start(t)
	tasksYAML := fmt.Sprintf("  fair:\n    semaphore: {key: shared, capacity: 4, fair_by: \"{tenant}\"%s}\n", weights)
	startWorkers(t, srv, 3, tasksYAML, "fair", log.handler(40*time.Millisecond))
	cfg, err := worker.ParseConfig([]byte(fmt.Sprintf("redis:\n  url: %q\ntasks:\n%s", srv.URL(), tasksYAML)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := producer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func enqueueTenant(t *testing.T, p *producer.Producer, tenant string, n int) {
	t.Helper()
	for i := range n {
		payload := fmt.Sprintf(`{"tenant":%q,"n":%d}`, tenant, i)
		if _, err := p.Enqueue(context.Background(), "fair", []byte(payload), asynq.MaxRetry(50)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFairShareOnAFleet: on three workers, 10 small tenants of 8 tasks
// each, enqueued behind 300 tasks of one tenant, run in their fair turns:
// while they wait, the big tenant starts about one task in 11 (the
// tenants that wait take turns), not its whole backlog first. The cap
// holds, and every task runs once.
func TestFairShareOnAFleet(t *testing.T) {
	log := newTenantLog()
	p := fairFleet(t, log, "")
	enqueueTenant(t, p, "big", 300)
	waitfor.Condition(t, 30*time.Second, "the big tenant's first tasks run", func() bool { return log.count() >= 8 })
	log.mu.Lock()
	before := len(log.started)
	log.mu.Unlock()
	start := time.Now()
	for i := range 10 {
		enqueueTenant(t, p, fmt.Sprintf("small-%d", i), 8)
	}
	waitfor.Condition(t, 60*time.Second, "every small task done", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		small := 0
		for tenant, n := range log.done {
			if tenant != "big" {
				small += n
			}
		}
		return small == 80
	})
	log.mu.Lock()
	var last time.Time
	bigDuring, seenSmall := 0, 0
	for _, tenant := range log.started[before:] {
		if seenSmall == 80 {
			break
		}
		if tenant == "big" {
			bigDuring++
		} else {
			seenSmall++
		}
	}
	for tenant, at := range log.doneAt {
		if tenant != "big" && at.After(last) {
			last = at
		}
	}
	log.mu.Unlock()
	t.Logf("the small tenants' 80 tasks finished %s after they were enqueued (fair share: about 0.9 s); the big tenant started %d tasks meanwhile",
		last.Sub(start).Round(time.Millisecond), bigDuring)
	// Their fair turns give the big tenant 8 starts of 88, plus the tasks
	// that already held a seat or a standby place; first come first served
	// would give it its whole backlog first.
	if bigDuring > 30 {
		t.Errorf("the big tenant started %d tasks while the small ones waited, want at most 30 (its fair turns)", bigDuring)
	}
	waitfor.Condition(t, 90*time.Second, "every task done", func() bool { return log.count() >= 380 })
	log.check(t, 4, 380)
}

// TestFairShareWeights: two backlogged tenants of weights 3 and 1 start
// tasks 3 to 1 while both wait.
func TestFairShareWeights(t *testing.T) {
	log := newTenantLog()
	p := fairFleet(t, log, `, weights: {"heavy": 3}`)
	for i := range 80 {
		for _, tenant := range []string{"heavy", "light"} {
			if _, err := p.Enqueue(context.Background(), "fair", []byte(fmt.Sprintf(`{"tenant":%q,"n":%d}`, tenant, i)), asynq.MaxRetry(50)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitfor.Condition(t, 60*time.Second, "80 tasks started", func() bool { return log.count() >= 80 })
	log.mu.Lock()
	heavy := 0
	// The first starts took seats before the backlog built up: count
	// from the 9th.
	for _, tenant := range log.started[8:80] {
		if tenant == "heavy" {
			heavy++
		}
	}
	log.mu.Unlock()
	share := float64(heavy) / 72
	t.Logf("the weight-3 tenant started %.3f of the tasks while both waited", share)
	if share < 0.65 || share > 0.85 {
		t.Errorf("the weight-3 tenant started %.3f of the tasks while both waited, want 0.75 +- 0.1", share)
	}
	waitfor.Condition(t, 90*time.Second, "every task done", func() bool { return log.count() >= 160 })
	log.check(t, 4, 160)
}
