package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/producer"
	"github.com/fleetcap/fleetcap/worker"
)

// fairFleet starts 3 workers of a fleet whose fair tasks share a cap of 4
// with fair_by tenant (and weights, if any), and returns a producer.
func fairFleet(t *testing.T, log *seatLog, weights string) *producer.Producer {
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
	log := newSeatLog()
	p := fairFleet(t, log, "")
	enqueueTenant(t, p, "big", 300)
	waitfor.Condition(t, 30*time.Second, "the big tenant's first tasks run", func() bool { return log.count() >= 8 })
	log.mu.Lock()
	before := len(log.tenants)
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
	for _, tenant := range log.tenants[before:] {
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
	log := newSeatLog()
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
	for _, tenant := range log.tenants[8:80] {
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
