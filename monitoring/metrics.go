// Package monitoring turns fleetcap's events into Prometheus metrics and
// OpenTelemetry traces, and serves the monitoring pages: /metrics, asynqmon,
// and the semaphores page with its JSON and admin API.
package monitoring

import (
	"errors"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// Metrics is the Prometheus side of fleetcap: it receives the semaphore's
// events (it is a semaphore.Observer), the rate limiter's (a
// ratelimit.Observer) and the worker's (Requeued, LeaseLost, Waiting), and
// exports them as the series listed in SPEC §1.3 plus the
// fleetcap_* series an operator needs. Gauges are per process; sum them
// across instances. Create it with NewMetrics; a worker's rendered keys are
// labelled by their templates once SetKeyLabels names them.
type Metrics struct {
	labels atomic.Pointer[keyLabels]

	acquisitions  *prometheus.CounterVec
	acquireFailed *prometheus.CounterVec
	wait          *prometheus.HistogramVec
	hold          *prometheus.HistogramVec
	active        *prometheus.GaugeVec
	capacity      *prometheus.GaugeVec
	waiting       *prometheus.GaugeVec
	leasesLost    *prometheus.CounterVec
	releasesLost  *prometheus.CounterVec
	taskLeaseLost *prometheus.CounterVec
	requeued      *prometheus.CounterVec

	rateTakes      *prometheus.CounterVec
	rateRetryAfter *prometheus.HistogramVec
	rateLimit      *prometheus.GaugeVec
}

var (
	_ semaphore.Observer   = (*Metrics)(nil)
	_ ratelimit.Observer   = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// WaitBuckets are the buckets of redisx_semaphore_wait_duration_seconds:
// from a millisecond (a seat free at once) to five minutes.
var WaitBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// HoldBuckets are the buckets of redisx_semaphore_hold_duration_seconds:
// from 5 ms (a no-op task) to an hour.
var HoldBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// RetryAfterBuckets are the buckets of fleetcap_ratelimit_retry_after_seconds:
// from a millisecond (a token almost due) to an hour (a rate per hour).
var RetryAfterBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// keyLabels map keys to the value of the "key" label (see SetKeyLabels).
type keyLabels struct {
	key, rateKey func(key string) string
}

// NewMetrics creates the metrics and registers them on reg, which should be
// the process's private registry (see NewRegistry), not the global one.
// Until SetKeyLabels, every key is its own label.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("monitoring: NewMetrics: nil Registerer")
	}
	m := &Metrics{
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redisx_semaphore_acquisitions_total",
			Help: "Acquire and TryAcquire calls by outcome: acquired, or failed (full, timeout, exhausted, error, shutdown, canceled).",
		}, []string{"key", "status"}),
		acquireFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetcap_semaphore_acquire_failures_total",
			Help: "Acquire and TryAcquire calls that took no seat, by reason: full, timeout, exhausted, error, shutdown, canceled.",
		}, []string{"key", "reason"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "redisx_semaphore_wait_duration_seconds",
			Help:    "Time from the Acquire call to the seat, for calls that took one (failures are counted in fleetcap_semaphore_acquire_failures_total).",
			Buckets: WaitBuckets,
		}, []string{"key"}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "redisx_semaphore_hold_duration_seconds",
			Help:    "Time from acquisition to release of a seat.",
			Buckets: HoldBuckets,
		}, []string{"key"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "redisx_semaphore_permits_active",
			Help: "Seats held by this process.",
		}, []string{"key"}),
		capacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetcap_semaphore_capacity",
			Help: "Declared fleet-wide capacity of a semaphore key (seats per rendered key for a template).",
		}, []string{"key"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetcap_semaphore_waiting",
			Help: "Worker slots of this process that hold a task of this key which is not running: it asks for its seat, or stands by for one.",
		}, []string{"key"}),
		leasesLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetcap_semaphore_leases_lost_total",
			Help: "Seats that auto-renewal found gone (expired or force-released) while still held.",
		}, []string{"key"}),
		releasesLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetcap_semaphore_releases_lost_total",
			Help: "Releases that found the seat already gone: the cap did not hold for the whole run.",
		}, []string{"key"}),
		taskLeaseLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetcap_tasks_lease_lost_total",
			Help: "Running tasks whose seat was lost, by task type.",
		}, []string{"key", "task_type"}),
		requeued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetcap_tasks_requeued_total",
			Help: "Tasks given back to the queue without counting as a failure, by why: full, timeout, shutdown, lease_lost, rate_limited (the key is a rate limit's), error.",
		}, []string{"key", "task_type", "why"}),
		rateTakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetcap_ratelimit_takes_total",
			Help: "Takes of rate-limit tokens by outcome: allowed, or limited (no token yet).",
		}, []string{"key", "status"}),
		rateRetryAfter: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fleetcap_ratelimit_retry_after_seconds",
			Help:    "For limited takes: the wait until the tokens are due.",
			Buckets: RetryAfterBuckets,
		}, []string{"key"}),
		rateLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetcap_ratelimit_tokens_per_second",
			Help: "Declared fleet-wide rate of a rate-limit key, in tokens per second (per rendered key for a template).",
		}, []string{"key"}),
	}
	m.SetKeyLabels(nil, nil)
	if err := reg.Register(m); err != nil {
		return nil, err
	}
	return m, nil
}

// SetKeyLabels sets how keys map to the value of the "key" label: keyLabel
// for semaphore keys, rateKeyLabel for rate-limit keys; nil maps a key to
// itself. A worker with per-tenant keys ("tenant:{tenant_id}" rendered for
// 10,000 tenants) maps each rendered key back to its template, so that the
// label stays bounded (worker.Worker's KeyLabel and KeyIndex's
// RateKeyLabel). The metrics are the worker's Observer and so exist before
// the worker that names the keys: set the labels once it does, before it
// runs and before the series of its keys are declared. Both functions are
// called on every event and must be fast and safe for concurrent use.
func (m *Metrics) SetKeyLabels(keyLabel, rateKeyLabel func(key string) string) {
	self := func(key string) string { return key }
	l := &keyLabels{key: keyLabel, rateKey: rateKeyLabel}
	if l.key == nil {
		l.key = self
	}
	if l.rateKey == nil {
		l.rateKey = self
	}
	m.labels.Store(l)
}

// keyLabel is the label of a semaphore key.
func (m *Metrics) keyLabel(key string) string { return m.labels.Load().key(key) }

// rateKeyLabel is the label of a rate-limit key.
func (m *Metrics) rateKeyLabel(key string) string { return m.labels.Load().rateKey(key) }

// NewRegistry returns a private registry that already holds the Go runtime
// and process collectors; register Metrics and a QueueCollector on it and
// serve it as ServerOptions.Gatherer.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.acquisitions, m.acquireFailed, m.wait, m.hold, m.active, m.capacity,
		m.waiting, m.leasesLost, m.releasesLost, m.taskLeaseLost, m.requeued,
		m.rateTakes, m.rateRetryAfter, m.rateLimit,
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// SetCapacity records the declared capacity of a key (for a template, the
// seats of each rendered key) and creates its series at zero (see
// DeclareKey). Call it once per declared key at start.
func (m *Metrics) SetCapacity(key string, capacity int) {
	m.capacity.WithLabelValues(m.keyLabel(key)).Set(float64(capacity))
	m.DeclareKey(key)
}

// failureReasons are the reasons of fleetcap_semaphore_acquire_failures_total.
var failureReasons = []string{
	string(semaphore.OutcomeFull),
	string(semaphore.ReasonTimeout),
	string(semaphore.ReasonExhausted),
	string(semaphore.ReasonError),
	string(semaphore.ReasonShutdown),
	string(semaphore.ReasonCanceled),
}

// DeclareKey creates the series of a declared key or template at zero
// (acquisitions, failures by reason, seats held, slots waiting, lost
// leases and releases), so
// that increase(), rate() and dashboards see the key before its first
// event. SetCapacity calls it; call it alone for a key whose capacity is
// not exported.
func (m *Metrics) DeclareKey(key string) {
	k := m.keyLabel(key)
	m.acquisitions.WithLabelValues(k, "acquired")
	m.acquisitions.WithLabelValues(k, "failed")
	for _, reason := range failureReasons {
		m.acquireFailed.WithLabelValues(k, reason)
	}
	m.active.WithLabelValues(k)
	m.waiting.WithLabelValues(k)
	m.leasesLost.WithLabelValues(k)
	m.releasesLost.WithLabelValues(k)
}

// DeclareTask creates at zero the series of taskType's tasks on key (a
// cap's key or template, or with rate set a rate limit's): their lost
// leases (caps only) and their requeues for each of whys, so that
// increase() and rate() see the first event. Call it once per task type
// and key at start.
func (m *Metrics) DeclareTask(key, taskType string, rate bool, whys ...string) {
	k := m.keyLabel(key)
	if rate {
		k = m.rateKeyLabel(key)
	} else {
		m.taskLeaseLost.WithLabelValues(k, taskType)
	}
	for _, why := range whys {
		m.requeued.WithLabelValues(k, taskType, why)
	}
}

// Acquire implements semaphore.Observer.
func (m *Metrics) Acquire(e semaphore.AcquireEvent) {
	if e.Outcome == semaphore.OutcomeStandby {
		return // no seat yet, no failure either: the wait's own event ends it
	}
	k := m.keyLabel(e.Key)
	if e.Acquired() {
		m.acquisitions.WithLabelValues(k, "acquired").Inc()
		m.wait.WithLabelValues(k).Observe(e.Wait.Seconds())
		return
	}
	m.acquisitions.WithLabelValues(k, "failed").Inc()
	reason := string(e.Outcome)
	if reason == "" {
		reason = "unknown"
	}
	m.acquireFailed.WithLabelValues(k, reason).Inc()
}

// Release implements semaphore.Observer.
func (m *Metrics) Release(e semaphore.ReleaseEvent) {
	k := m.keyLabel(e.Key)
	m.hold.WithLabelValues(k).Observe(e.Held.Seconds())
	if e.Lost {
		m.releasesLost.WithLabelValues(k).Inc()
	}
}

// Lost implements semaphore.Observer.
func (m *Metrics) Lost(key string) {
	m.leasesLost.WithLabelValues(m.keyLabel(key)).Inc()
}

// ActiveChanged implements semaphore.Observer.
func (m *Metrics) ActiveChanged(key string, delta int) {
	m.active.WithLabelValues(m.keyLabel(key)).Add(float64(delta))
}

// Requeued counts a task the worker gave back to the queue without a
// failure; why is one of the worker's RequeueReasons ("full", "timeout",
// "shutdown", "lease_lost", "error", or "rate_limited", whose key is a
// rate limit's and is labelled as a rate-limit key (see SetKeyLabels)).
func (m *Metrics) Requeued(key, taskType, why string) {
	k := m.keyLabel(key)
	if why == "rate_limited" {
		k = m.rateKeyLabel(key)
	}
	m.requeued.WithLabelValues(k, taskType, why).Inc()
}

// LeaseLost counts a running task whose seat was lost.
func (m *Metrics) LeaseLost(key, taskType string) {
	m.taskLeaseLost.WithLabelValues(m.keyLabel(key), taskType).Inc()
}

// Waiting adds delta to the worker slots that hold a task of key which is
// not running.
func (m *Metrics) Waiting(key string, delta int) {
	m.waiting.WithLabelValues(m.keyLabel(key)).Add(float64(delta))
}

// SetRateLimit records the declared rate of a rate-limit key (for a
// template, that of each rendered key) and creates its series at zero. Call
// it once per declared key at start.
func (m *Metrics) SetRateLimit(key string, limit ratelimit.Limit) {
	k := m.rateKeyLabel(key)
	m.rateLimit.WithLabelValues(k).Set(float64(limit.Rate) / limit.Per.Seconds())
	m.rateTakes.WithLabelValues(k, "allowed")
	m.rateTakes.WithLabelValues(k, "limited")
}

// Take implements ratelimit.Observer.
func (m *Metrics) Take(e ratelimit.TakeEvent) {
	k := m.rateKeyLabel(e.Key)
	if e.Allowed {
		m.rateTakes.WithLabelValues(k, "allowed").Inc()
		return
	}
	m.rateTakes.WithLabelValues(k, "limited").Inc()
	m.rateRetryAfter.WithLabelValues(k).Observe(e.RetryAfter.Seconds())
}
