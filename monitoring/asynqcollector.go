package monitoring

import (
	"errors"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
)

// QueueCollectorOptions tunes NewQueueCollector.
type QueueCollectorOptions struct {
	// CacheFor is how long one reading of the queues serves scrapes:
	// GetQueueInfo runs a heavy Lua script per queue, and several
	// Prometheus servers may scrape every few seconds. Default 5s; a
	// negative value reads Redis on every scrape.
	CacheFor time.Duration
	// Logger receives read errors (at most one per CacheFor). Default
	// slog.Default().
	Logger *slog.Logger
}

// QueueCollector exports asynq's queue statistics, read through an
// asynq.Inspector, under the names of asynq's x/metrics collector so that
// its dashboards work: asynq_tasks_enqueued_total{queue,state},
// asynq_queue_size{queue}, asynq_queue_latency_seconds{queue},
// asynq_queue_memory_usage_approx_bytes{queue},
// asynq_tasks_processed_total{queue}, asynq_tasks_failed_total{queue} and
// asynq_queue_paused_total{queue}. It adds fleetcap_asynq_up (0 when the
// last reading failed). Create it with NewQueueCollector.
type QueueCollector struct {
	insp  *asynq.Inspector
	cache scrapeCache[[]*asynq.QueueInfo]
}

var _ prometheus.Collector = (*QueueCollector)(nil)

var (
	queueStateDesc = prometheus.NewDesc("asynq_tasks_enqueued_total",
		"Number of tasks in a queue, by state (active, pending, aggregating, scheduled, retry, archived, completed).",
		[]string{"queue", "state"}, nil)
	queueSizeDesc = prometheus.NewDesc("asynq_queue_size",
		"Number of tasks in a queue (pending, active, scheduled, retry, aggregating and archived).",
		[]string{"queue"}, nil)
	queueLatencyDesc = prometheus.NewDesc("asynq_queue_latency_seconds",
		"Seconds the oldest pending task of a queue has been waiting.",
		[]string{"queue"}, nil)
	queueMemoryDesc = prometheus.NewDesc("asynq_queue_memory_usage_approx_bytes",
		"Approximate memory used by a queue and its tasks in Redis (sampled).",
		[]string{"queue"}, nil)
	queueProcessedDesc = prometheus.NewDesc("asynq_tasks_processed_total",
		"Tasks processed by a queue, succeeded and failed.",
		[]string{"queue"}, nil)
	queueFailedDesc = prometheus.NewDesc("asynq_tasks_failed_total",
		"Tasks of a queue that failed.",
		[]string{"queue"}, nil)
	queuePausedDesc = prometheus.NewDesc("asynq_queue_paused_total",
		"1 when the queue is paused, else 0.",
		[]string{"queue"}, nil)
	asynqUpDesc = prometheus.NewDesc("fleetcap_asynq_up",
		"1 when the last reading of asynq's queues from Redis succeeded, else 0.",
		nil, nil)
)

// NewQueueCollector returns a collector reading queue statistics through
// insp. The caller owns insp (and closes it); a nil insp reports
// fleetcap_asynq_up 0.
func NewQueueCollector(insp *asynq.Inspector, opts QueueCollectorOptions) *QueueCollector {
	return &QueueCollector{insp: insp, cache: newScrapeCache[[]*asynq.QueueInfo](opts.CacheFor, opts.Logger, "asynq queue statistics")}
}

// Describe implements prometheus.Collector. It sends fixed descriptors and
// does not touch Redis.
func (c *QueueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		queueStateDesc, queueSizeDesc, queueLatencyDesc, queueMemoryDesc,
		queueProcessedDesc, queueFailedDesc, queuePausedDesc, asynqUpDesc,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *QueueCollector) Collect(ch chan<- prometheus.Metric) {
	infos, err := c.cache.get(c.readQueues)
	up := 1.0
	if err != nil {
		up = 0
	}
	ch <- prometheus.MustNewConstMetric(asynqUpDesc, prometheus.GaugeValue, up)
	for _, q := range infos {
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{q.Queue}, labels...)...)
		}
		for _, s := range []struct {
			state string
			n     int
		}{
			{"active", q.Active}, {"pending", q.Pending}, {"aggregating", q.Aggregating},
			{"scheduled", q.Scheduled}, {"retry", q.Retry}, {"archived", q.Archived},
			{"completed", q.Completed},
		} {
			gauge(queueStateDesc, float64(s.n), s.state)
		}
		gauge(queueSizeDesc, float64(q.Size))
		gauge(queueLatencyDesc, q.Latency.Seconds())
		gauge(queueMemoryDesc, float64(q.MemoryUsage))
		paused := 0.0
		if q.Paused {
			paused = 1
		}
		gauge(queuePausedDesc, paused)
		ch <- prometheus.MustNewConstMetric(queueProcessedDesc, prometheus.CounterValue, float64(q.ProcessedTotal), q.Queue)
		ch <- prometheus.MustNewConstMetric(queueFailedDesc, prometheus.CounterValue, float64(q.FailedTotal), q.Queue)
	}
}

func (c *QueueCollector) readQueues() ([]*asynq.QueueInfo, error) {
	if c.insp == nil {
		return nil, errors.New("monitoring: QueueCollector has no Inspector")
	}
	names, err := c.insp.Queues()
	if err != nil {
		return nil, err
	}
	infos := make([]*asynq.QueueInfo, 0, len(names))
	var errs []error
	for _, name := range names {
		info, err := c.insp.GetQueueInfo(name)
		if err != nil {
			// One queue failing (or deleted since Queues) must not hide
			// the others.
			errs = append(errs, err)
			continue
		}
		infos = append(infos, info)
	}
	return infos, errors.Join(errs...)
}
