// Package workermon builds the monitoring server of a worker.Worker. It is
// the seam between package worker and package monitoring, which import
// neither the other: the worker reports to monitoring.Metrics through its
// Observer, and NewServer hands the monitoring server what it reads from
// the worker (its semaphore, rate limiter, overrides, asynq connection and
// declared keys).
//
// The metrics are the worker's Observer, so they exist before the worker;
// the labels of its keys exist only with it. NewServer closes that loop:
//
//	reg := monitoring.NewRegistry()
//	metrics, err := monitoring.NewMetrics(reg)
//	...
//	w, err := worker.New(cfg, worker.WithObserver(metrics))
//	...
//	srv, err := workermon.NewServer(w, workermon.Options{Registry: reg, Metrics: metrics})
package workermon

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetcap/fleetcap/monitoring"
	"github.com/fleetcap/fleetcap/worker"
)

// Options tunes NewServer. The address, the admin token and whether
// asynqmon may write come from the worker's config (its monitoring
// section).
type Options struct {
	// Registry is the process's private registry (monitoring.NewRegistry),
	// served at GET /metrics; NewServer registers the worker's queue and
	// waiting-room collectors on it. Nil: no /metrics.
	Registry *prometheus.Registry
	// Metrics are the worker's Observer (worker.WithObserver), registered
	// on Registry. NewServer labels them by the worker's keys (a rendered
	// key by its template) and creates the series of its declared keys
	// and task types at zero. Nil: none of that.
	Metrics *monitoring.Metrics
	// Logger receives admin actions and errors. Default slog.Default().
	Logger *slog.Logger
}

// NewServer builds the monitoring server of w, as cmd/worker serves it:
// every endpoint of SPEC §3, the runtime overrides of w's caps and rates,
// and /readyz answered by w's Redis. Call it once the handlers are
// registered (after any SetCaps), and with Metrics before w runs: until
// then the metrics label every key as itself. Nothing listens until the
// server's Serve or ListenAndServe.
func NewServer(w *worker.Worker, opts Options) (*monitoring.Server, error) {
	keys, err := worker.NewKeyIndex(w.Config())
	if err != nil {
		return nil, err
	}
	if opts.Metrics != nil {
		opts.Metrics.SetKeyLabels(w.KeyLabel, keys.RateKeyLabel)
		declareSeries(opts.Metrics, w, keys)
	}
	capKeys := func(context.Context) ([]monitoring.KeyInfo, error) {
		declared := w.DeclaredKeys()
		out := make([]monitoring.KeyInfo, len(declared))
		for i, k := range declared {
			out[i] = keyInfo(k)
		}
		return out, nil
	}
	mon := w.Config().Monitoring
	srvOpts := monitoring.ServerOptions{
		Addr:      mon.Addr,
		Semaphore: w.Semaphore(),
		Keys:      capKeys,
		LookupKey: func(key string) (monitoring.KeyInfo, bool) {
			k, ok := keys.LookupCap(key)
			return keyInfo(k), ok
		},
		RateLimiter: w.Limiter(),
		RateKeys: func(context.Context) ([]monitoring.RateKeyInfo, error) {
			return rateKeys(w, keys), nil
		},
		LookupRateKey: func(key string) (monitoring.RateKeyInfo, bool) {
			k, ok := keys.LookupRate(key)
			return rateKeyInfo(k), ok
		},
		Overrides:        w.Overrides(),
		AdminToken:       mon.AdminToken,
		RedisConnOpt:     w.RedisConnOpt(),
		AsynqmonWritable: !mon.ReadOnly(),
		Ready:            w.Ping,
		Logger:           opts.Logger,
	}
	if opts.Registry != nil {
		rooms, err := monitoring.NewRoomCollector(w.Semaphore(), capKeys, monitoring.RoomCollectorOptions{Logger: opts.Logger,
			Limiter: w.Limiter(), RateKeys: srvOpts.RateKeys})
		if err != nil {
			return nil, err
		}
		queues := monitoring.NewQueueCollector(w.Inspector(), monitoring.QueueCollectorOptions{Logger: opts.Logger})
		if err := registerAll(opts.Registry, queues, rooms); err != nil {
			return nil, err
		}
		srvOpts.Gatherer = opts.Registry
	}
	return monitoring.NewServer(srvOpts)
}

// declareSeries creates at zero the series of w's declared caps (a
// template's under its own label, without a capacity: its seats in use sum
// its rendered keys, which each have the capacity), rate limits and task
// types.
func declareSeries(m *monitoring.Metrics, w *worker.Worker, keys *worker.KeyIndex) {
	for _, k := range w.DeclaredKeys() {
		switch k.Template {
		case "":
			m.SetCapacity(k.Key, k.Capacity)
		case k.Key:
			m.DeclareKey(k.Key)
		}
	}
	for _, k := range keys.RateKeys() {
		m.SetRateLimit(k.Key, k.Limit)
	}
	for _, tk := range keys.TaskKeys() {
		whys := make([]string, len(tk.Reasons))
		for i, r := range tk.Reasons {
			whys[i] = string(r)
		}
		m.DeclareTask(tk.Key, tk.TaskType, tk.Rate, whys...)
	}
}

// rateKeys are the rate-limit rows: the declared keys and templates, then
// the keys w rendered from templates lately.
func rateKeys(w *worker.Worker, keys *worker.KeyIndex) []monitoring.RateKeyInfo {
	declared := keys.RateKeys()
	out := make([]monitoring.RateKeyInfo, 0, len(declared))
	for _, k := range declared {
		out = append(out, rateKeyInfo(k))
	}
	for _, key := range w.RenderedRateKeys() {
		if k, ok := keys.LookupRate(key); ok {
			out = append(out, rateKeyInfo(k))
		}
	}
	return out
}

// registerAll registers cs on reg, stopping at the first error.
func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func keyInfo(k worker.DeclaredKey) monitoring.KeyInfo {
	return monitoring.KeyInfo{Key: k.Key, Capacity: k.Capacity, Template: k.Template}
}

func rateKeyInfo(k worker.DeclaredRateKey) monitoring.RateKeyInfo {
	return monitoring.RateKeyInfo{Key: k.Key, Template: k.Template, Limit: k.Limit, MaxCost: k.MaxCost}
}
