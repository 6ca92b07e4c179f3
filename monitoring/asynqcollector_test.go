package monitoring

import (
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
)

// fakeClock is a settable clock for the collector's cache.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestQueueCollector(t *testing.T) {
	srv := redistest.Start(t)
	opt := asynq.RedisClientOpt{Addr: srv.Addr()}
	client := asynq.NewClient(opt)
	t.Cleanup(func() { _ = client.Close() })
	insp := asynq.NewInspector(opt)
	t.Cleanup(func() { _ = insp.Close() })

	for range 3 {
		if _, err := client.Enqueue(asynq.NewTask("report:fetch", nil)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Enqueue(asynq.NewTask("report:fetch", nil), asynq.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(asynq.NewTask("mail:send", nil), asynq.Queue("critical")); err != nil {
		t.Fatal(err)
	}
	if err := insp.PauseQueue("critical"); err != nil {
		t.Fatal(err)
	}

	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	qc := NewQueueCollector(insp, QueueCollectorOptions{})
	qc.cache.now = clock.Now
	reg := prometheus.NewRegistry()
	reg.MustRegister(qc)

	mfs := families(t, reg)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"fleetcap_asynq_up", nil, 1},
		{"asynq_tasks_enqueued_total", []string{"queue", "default", "state", "pending"}, 3},
		{"asynq_tasks_enqueued_total", []string{"queue", "default", "state", "scheduled"}, 1},
		{"asynq_tasks_enqueued_total", []string{"queue", "default", "state", "active"}, 0},
		{"asynq_queue_size", []string{"queue", "default"}, 4},
		{"asynq_queue_size", []string{"queue", "critical"}, 1},
		{"asynq_queue_paused_total", []string{"queue", "default"}, 0},
		{"asynq_queue_paused_total", []string{"queue", "critical"}, 1},
		{"asynq_tasks_processed_total", []string{"queue", "default"}, 0},
		{"asynq_tasks_failed_total", []string{"queue", "default"}, 0},
	} {
		if got := mustSample(t, mfs, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if v := mustSample(t, mfs, "asynq_queue_memory_usage_approx_bytes", "queue", "default"); v <= 0 {
		t.Errorf("memory usage = %v, want > 0", v)
	}
	mustSample(t, mfs, "asynq_queue_latency_seconds", "queue", "default")

	// Within the cache interval a scrape reuses the reading.
	if _, err := client.Enqueue(asynq.NewTask("report:fetch", nil)); err != nil {
		t.Fatal(err)
	}
	clock.Add(4 * time.Second)
	if got := mustSample(t, families(t, reg), "asynq_queue_size", "queue", "default"); got != 4 {
		t.Errorf("cached queue size = %v, want 4", got)
	}
	clock.Add(2 * time.Second)
	if got := mustSample(t, families(t, reg), "asynq_queue_size", "queue", "default"); got != 5 {
		t.Errorf("fresh queue size = %v, want 5", got)
	}

	// With Redis gone the collector says so and exports no stale numbers.
	srv.Stop()
	clock.Add(6 * time.Second)
	mfs = families(t, reg)
	if got := mustSample(t, mfs, "fleetcap_asynq_up"); got != 0 {
		t.Errorf("up after Redis stopped = %v, want 0", got)
	}
	if _, ok := mfs["asynq_queue_size"]; ok {
		t.Error("asynq_queue_size still exported while Redis is down")
	}
}
