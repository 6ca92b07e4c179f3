package monitoring

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// templateOf labels the keys starting with prefix by template, as a
// worker labels a template's rendered keys.
func templateOf(prefix, template string) func(string) string {
	return func(key string) string {
		if strings.HasPrefix(key, prefix) {
			return template
		}
		return key
	}
}

func TestMetricsFromObserverEvents(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetCapacity("legacy-api", 5)
	m.Acquire(semaphore.AcquireEvent{Key: "legacy-api", Capacity: 5, Outcome: semaphore.OutcomeAcquired, Attempts: 1, Wait: 3 * time.Millisecond})
	m.ActiveChanged("legacy-api", +1)
	m.Acquire(semaphore.AcquireEvent{Key: "legacy-api", Capacity: 5, Outcome: semaphore.OutcomeFull, Attempts: 1})
	m.Acquire(semaphore.AcquireEvent{Key: "legacy-api", Capacity: 5, Outcome: semaphore.Outcome(semaphore.ReasonTimeout), Attempts: 4, Wait: time.Second})
	m.Requeued("legacy-api", "report:fetch", "full")
	m.Waiting("legacy-api", +2)
	m.Waiting("legacy-api", -1)
	m.Lost("legacy-api")
	m.LeaseLost("legacy-api", "report:fetch")
	m.Release(semaphore.ReleaseEvent{Key: "legacy-api", Held: 2 * time.Second, Lost: true})
	m.ActiveChanged("legacy-api", -1)

	mfs := families(t, reg)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"fleetcap_semaphore_capacity", []string{"key", "legacy-api"}, 5},
		{"redisx_semaphore_acquisitions_total", []string{"key", "legacy-api", "status", "acquired"}, 1},
		{"redisx_semaphore_acquisitions_total", []string{"key", "legacy-api", "status", "failed"}, 2},
		{"fleetcap_semaphore_acquire_failures_total", []string{"key", "legacy-api", "reason", "full"}, 1},
		{"fleetcap_semaphore_acquire_failures_total", []string{"key", "legacy-api", "reason", "timeout"}, 1},
		{"redisx_semaphore_wait_duration_seconds", []string{"key", "legacy-api"}, 1}, // acquired calls only
		{"redisx_semaphore_hold_duration_seconds", []string{"key", "legacy-api"}, 1},
		{"redisx_semaphore_permits_active", []string{"key", "legacy-api"}, 0},
		{"fleetcap_semaphore_waiting", []string{"key", "legacy-api"}, 1},
		{"fleetcap_semaphore_leases_lost_total", []string{"key", "legacy-api"}, 1},
		{"fleetcap_semaphore_releases_lost_total", []string{"key", "legacy-api"}, 1},
		{"fleetcap_tasks_lease_lost_total", []string{"key", "legacy-api", "task_type", "report:fetch"}, 1},
		{"fleetcap_tasks_requeued_total", []string{"key", "legacy-api", "task_type", "report:fetch", "why", "full"}, 1},
	} {
		if got := mustSample(t, mfs, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

func TestMetricsSetCapacityCreatesZeroSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetCapacity("k", 3)
	mfs := families(t, reg)
	for _, status := range []string{"acquired", "failed"} {
		if v := mustSample(t, mfs, "redisx_semaphore_acquisitions_total", "key", "k", "status", status); v != 0 {
			t.Errorf("status %s = %v, want 0", status, v)
		}
	}
	mustSample(t, mfs, "redisx_semaphore_permits_active", "key", "k")
}

// TestMetricsDeclaredSeriesStartAtZero: every counter an alert takes
// increase() or rate() of exists at 0 for the declared keys and their task
// types from the start (a series born at 1 hides its first event from
// increase()), a template's under its own label, a rate limit's requeues
// under the rate limit's label.
func TestMetricsDeclaredSeriesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetKeyLabels(nil, templateOf("stripe:", "stripe:{account_id}"))
	m.SetCapacity("legacy-api", 5)
	m.DeclareKey("tenant:{tenant_id}")
	m.DeclareTask("legacy-api", "report:fetch", false, "full", "timeout")
	m.DeclareTask("stripe:{account_id}", "report:fetch", true, "rate_limited")
	mfs := families(t, reg)
	for _, c := range []struct {
		name   string
		labels []string
	}{
		{"fleetcap_semaphore_leases_lost_total", []string{"key", "legacy-api"}},
		{"fleetcap_semaphore_releases_lost_total", []string{"key", "legacy-api"}},
		{"fleetcap_semaphore_leases_lost_total", []string{"key", "tenant:{tenant_id}"}},
		{"fleetcap_semaphore_releases_lost_total", []string{"key", "tenant:{tenant_id}"}},
		{"redisx_semaphore_acquisitions_total", []string{"key", "tenant:{tenant_id}", "status", "acquired"}},
		{"fleetcap_semaphore_acquire_failures_total", []string{"key", "legacy-api", "reason", "full"}},
		{"fleetcap_semaphore_acquire_failures_total", []string{"key", "tenant:{tenant_id}", "reason", "timeout"}},
		{"fleetcap_tasks_lease_lost_total", []string{"key", "legacy-api", "task_type", "report:fetch"}},
		{"fleetcap_tasks_requeued_total", []string{"key", "legacy-api", "task_type", "report:fetch", "why", "full"}},
		{"fleetcap_tasks_requeued_total", []string{"key", "legacy-api", "task_type", "report:fetch", "why", "timeout"}},
		{"fleetcap_tasks_requeued_total", []string{"key", "stripe:{account_id}", "task_type", "report:fetch", "why", "rate_limited"}},
	} {
		if got := mustSample(t, mfs, c.name, c.labels...); got != 0 {
			t.Errorf("%s%v = %v at start, want 0", c.name, c.labels, got)
		}
	}
	if _, ok := sample(mfs, "fleetcap_tasks_lease_lost_total", "key", "stripe:{account_id}"); ok {
		t.Error("a rate limit's key has a lost-lease series")
	}
	if _, ok := sample(mfs, "fleetcap_semaphore_capacity", "key", "tenant:{tenant_id}"); ok {
		t.Error("DeclareKey exported a capacity")
	}
	// A rendered rate-limit key's requeue counts under its template, in
	// the series created at start.
	m.Requeued("stripe:acct_1", "report:fetch", "rate_limited")
	mfs = families(t, reg)
	if got := mustSample(t, mfs, "fleetcap_tasks_requeued_total", "key", "stripe:{account_id}", "why", "rate_limited"); got != 1 {
		t.Errorf("requeued for a rendered rate key under its template = %v, want 1", got)
	}
	if _, ok := sample(mfs, "fleetcap_tasks_requeued_total", "key", "stripe:acct_1"); ok {
		t.Error("a rendered rate-limit key has a requeue series of its own")
	}
}

// TestStandbyThenSeatIsNotAFailure: a task that finds the cap full, takes a
// standby place and then its seat counts one acquisition and no failure
// (it used to count a failed acquire, reason full, first, so that "seats
// not taken" read half of all acquisitions in normal running); a task
// parked for want of a place still counts as full.
func TestStandbyThenSeatIsNotAFailure(t *testing.T) {
	f := newFixture(t, fixtureOptions{keys: []KeyInfo{{Key: "legacy-api", Capacity: 1}}})
	ctx := context.Background()
	held := f.hold(t, "legacy-api", 1, 1, "running")
	room := semaphore.Room{Standby: 1, Hold: time.Minute, Transit: time.Minute, TTL: time.Minute}
	e, err := f.sem.Enter(ctx, "legacy-api", 1, "default\x00a", room, semaphore.WithHolder("a"))
	if err != nil || !e.Standby {
		t.Fatalf("Enter on a full cap: %+v, %v; want a standby place", e, err)
	}
	mfs := scrape(t, f.http.URL+"/metrics")
	if got := mustSample(t, mfs, "redisx_semaphore_acquisitions_total", "key", "legacy-api", "status", "failed"); got != 0 {
		t.Errorf("a task standing by counts %v failed acquisitions, want 0", got)
	}
	got := make(chan error, 1)
	go func() {
		p, err := e.Wait(ctx, semaphore.WithWaitTimeout(10*time.Second))
		if err == nil {
			err = p.Release(ctx)
		}
		got <- err
	}()
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the task standing by: %v", err)
	}
	if err := e.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	// A second task finds the seat free; a third, with the seat taken and
	// the place too, is parked: that is a seat not taken for want of one.
	f.hold(t, "legacy-api", 1, 1, "again")
	if e, err := f.sem.Enter(ctx, "legacy-api", 1, "default\x00b", room); err != nil || !e.Standby {
		t.Fatalf("b: %+v, %v; want a standby place", e, err)
	}
	if e, err := f.sem.Enter(ctx, "legacy-api", 1, "default\x00c", room); err != nil || e.Standby || e.Permit != nil {
		t.Fatalf("c: %+v, %v; want parked", e, err)
	}

	mfs = scrape(t, f.http.URL+"/metrics")
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"redisx_semaphore_acquisitions_total", []string{"key", "legacy-api", "status", "acquired"}, 3},
		{"redisx_semaphore_acquisitions_total", []string{"key", "legacy-api", "status", "failed"}, 1},
		{"fleetcap_semaphore_acquire_failures_total", []string{"key", "legacy-api", "reason", "full"}, 1},
	} {
		if got := mustSample(t, mfs, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, ok := sample(mfs, "fleetcap_semaphore_acquire_failures_total", "reason", "standby"); ok {
		t.Error("standing by is counted as a reason a seat was not taken")
	}
}

func TestMetricsKeyLabelBoundsCardinality(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetKeyLabels(templateOf("tenant:", "tenant:{tenant_id}"), nil)
	for i := range 1000 {
		key := "tenant:" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		m.Acquire(semaphore.AcquireEvent{Key: key, Capacity: 2, Outcome: semaphore.OutcomeAcquired, Attempts: 1})
		m.ActiveChanged(key, +1)
	}
	mfs := families(t, reg)
	if n := len(mfs["redisx_semaphore_acquisitions_total"].GetMetric()); n != 1 {
		t.Fatalf("acquisitions series = %d, want 1", n)
	}
	if v := mustSample(t, mfs, "redisx_semaphore_acquisitions_total", "key", "tenant:{tenant_id}", "status", "acquired"); v != 1000 {
		t.Errorf("acquired = %v, want 1000", v)
	}
	if v := mustSample(t, mfs, "redisx_semaphore_permits_active", "key", "tenant:{tenant_id}"); v != 1000 {
		t.Errorf("active = %v, want 1000", v)
	}
}

func TestNewMetricsErrors(t *testing.T) {
	if _, err := NewMetrics(nil); err == nil {
		t.Error("nil registerer: want an error")
	}
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	_, err := NewMetrics(reg)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Errorf("second registration: err = %v, want AlreadyRegisteredError", err)
	}
}

func TestNewRegistryHasRuntimeMetrics(t *testing.T) {
	mfs := families(t, NewRegistry())
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if _, ok := mfs[name]; !ok {
			t.Errorf("missing %s", name)
		}
	}
}

// workerObserver mirrors worker.Observer (monitoring must not import
// worker): Metrics must keep satisfying it.
type workerObserver interface {
	semaphore.Observer
	Requeued(key, taskType, why string)
	LeaseLost(key, taskType string)
	Waiting(key string, delta int)
}

var _ workerObserver = (*Metrics)(nil)

// TestRateLimitMetricsFromARealLimiter takes tokens of two rendered keys of
// one template on a real Redis: both count under the template's label, the
// limited takes with the wait until their token.
func TestRateLimitMetricsFromARealLimiter(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetKeyLabels(nil, templateOf("stripe:", "stripe:{account_id}"))
	limit := ratelimit.Limit{Rate: 1, Per: time.Minute, Burst: 1}
	m.SetRateLimit("stripe:{account_id}", limit)
	m.SetRateLimit("slack", ratelimit.Limit{Rate: 2, Per: time.Second, Burst: 2})
	limiter, err := ratelimit.New(redistest.Start(t).Client(), ratelimit.Options{Observer: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, key := range []string{"stripe:acct_1", "stripe:acct_1", "stripe:acct_2"} {
		if _, err := limiter.Take(ctx, key, limit, 1); err != nil {
			t.Fatal(err)
		}
	}

	mfs := families(t, reg)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"fleetcap_ratelimit_tokens_per_second", []string{"key", "slack"}, 2},
		{"fleetcap_ratelimit_tokens_per_second", []string{"key", "stripe:{account_id}"}, 1.0 / 60},
		{"fleetcap_ratelimit_takes_total", []string{"key", "stripe:{account_id}", "status", "allowed"}, 2},
		{"fleetcap_ratelimit_takes_total", []string{"key", "stripe:{account_id}", "status", "limited"}, 1},
		{"fleetcap_ratelimit_takes_total", []string{"key", "slack", "status", "limited"}, 0},
		{"fleetcap_ratelimit_retry_after_seconds", []string{"key", "stripe:{account_id}"}, 1},
	} {
		if got := mustSample(t, mfs, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, ok := sample(mfs, "fleetcap_ratelimit_takes_total", "key", "stripe:acct_1"); ok {
		t.Error("a rendered key has a series of its own")
	}
	h := mfs["fleetcap_ratelimit_retry_after_seconds"].GetMetric()[0].GetHistogram()
	if sum := h.GetSampleSum(); sum < 59 || sum > 60 {
		t.Errorf("retry-after sum %v s, want about a minute", sum)
	}
}
