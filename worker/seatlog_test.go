package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// seatLog records, across the workers of a test, the seats the running
// tasks hold (a task holds its payload's pages, 1 without) and the most
// held at once, the tasks in the order they started (by name, and by
// tenant), how often each ran, and each tenant's tasks done and last end.
type seatLog struct {
	mu       sync.Mutex
	inflight int
	peak     int
	started  []string // task names
	tenants  []string // their tenants, in the same order
	runs     map[string]int
	done     map[string]int
	doneAt   map[string]time.Time
}

func newSeatLog() *seatLog {
	return &seatLog{runs: map[string]int{}, done: map[string]int{}, doneAt: map[string]time.Time{}}
}

// handler runs a task of payload {"name", "tenant", "n", "pages"} for d;
// a task without a name is named tenant/n.
func (l *seatLog) handler(d time.Duration) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) error {
		var p struct {
			Name   string `json:"name"`
			Tenant string `json:"tenant"`
			N      int    `json:"n"`
			Pages  int    `json:"pages"`
		}
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return err
		}
		if p.Name == "" {
			p.Name = fmt.Sprintf("%s/%d", p.Tenant, p.N)
		}
		seats := max(p.Pages, 1)
		l.mu.Lock()
		l.inflight += seats
		l.peak = max(l.peak, l.inflight)
		l.started = append(l.started, p.Name)
		l.tenants = append(l.tenants, p.Tenant)
		l.runs[p.Name]++
		l.mu.Unlock()
		time.Sleep(d)
		l.mu.Lock()
		l.inflight -= seats
		l.done[p.Tenant]++
		l.doneAt[p.Tenant] = time.Now()
		l.mu.Unlock()
		return nil
	}
}

// count is how many tasks started.
func (l *seatLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.started)
}

// check fails the test when the running tasks held more than capacity
// seats at once, or a task ran twice or not at all.
func (l *seatLog) check(t *testing.T, capacity, tasks int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.peak > capacity {
		t.Errorf("the running tasks held %d seats at once, want at most %d", l.peak, capacity)
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
