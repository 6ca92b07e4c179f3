package workermon_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/fleetcap/fleetcap/internal/testutil/metricstest"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/monitoring"
	"github.com/fleetcap/fleetcap/monitoring/workermon"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
	"github.com/fleetcap/fleetcap/worker"
)

// TestNewServerWiresTheWorker builds the metrics before the worker (as its
// Observer) and the server from the worker: the metrics then label
// rendered keys by their templates, the declared keys' series exist at
// zero, and the server lists the worker's caps and rate limits and
// resolves a rendered key for the override API.
func TestNewServerWiresTheWorker(t *testing.T) {
	cfg, err := worker.ParseConfig([]byte(`redis: {url: "` + redistest.Start(t).URL() + `"}
monitoring: {admin_token: secret}
tasks:
  report:fetch:
    semaphores:
      - {key: legacy-api, capacity: 3}
      - {key: "tenant:{tenant_id}", capacity: 2}
    rate_limits: [{key: "stripe:{account_id}", rate: 10, per: 1s}]
`))
	if err != nil {
		t.Fatal(err)
	}
	reg := monitoring.NewRegistry()
	metrics, err := monitoring.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(cfg, worker.WithObserver(metrics))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	srv, err := workermon.NewServer(w, workermon.Options{Registry: reg, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		_ = srv.Shutdown(context.Background())
	})

	metrics.Acquire(semaphore.AcquireEvent{Key: "tenant:acme", Capacity: 2, Outcome: semaphore.OutcomeAcquired, Attempts: 1})
	metrics.Take(ratelimit.TakeEvent{Key: "stripe:acct_1", Allowed: true})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"redisx_semaphore_acquisitions_total", []string{"key", "tenant:{tenant_id}", "status", "acquired"}, 1},
		{"fleetcap_ratelimit_takes_total", []string{"key", "stripe:{account_id}", "status", "allowed"}, 1},
		{"fleetcap_semaphore_capacity", []string{"key", "legacy-api"}, 3},
		{"fleetcap_ratelimit_tokens_per_second", []string{"key", "stripe:{account_id}"}, 10},
		{"fleetcap_tasks_requeued_total", []string{"key", "stripe:{account_id}", "task_type", "report:fetch", "why", "rate_limited"}, 0},
		{"fleetcap_semaphore_rooms_up", nil, 1},
	} {
		if got, ok := metricstest.Sample(byName, c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (found: %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	for _, name := range []string{"redisx_semaphore_acquisitions_total", "fleetcap_ratelimit_takes_total"} {
		for _, m := range byName[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "key" && (l.GetValue() == "tenant:acme" || l.GetValue() == "stripe:acct_1") {
					t.Errorf("%s has a series of the rendered key %q", name, l.GetValue())
				}
			}
		}
	}

	type row struct {
		Kind string `json:"kind"`
		Key  string `json:"key"`
	}
	var rows []row
	resp, err := http.Get(hs.URL + "/api/semaphores")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&rows); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"semaphore legacy-api", "semaphore tenant:{tenant_id}", "rate stripe:{account_id}"} {
		if !slices.ContainsFunc(rows, func(r row) bool { return r.Kind+" "+r.Key == want }) {
			t.Errorf("GET /api/semaphores %+v lacks the row %s", rows, want)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		path, body string
		want       int
	}{
		{"/api/semaphores/tenant:acme/capacity", `{"capacity": 1}`, http.StatusOK},
		{"/api/semaphores/nope/capacity", `{"capacity": 1}`, http.StatusBadRequest},
		{"/api/ratelimits/stripe:acct_1", `{"rate": 5, "per": "1s"}`, http.StatusOK},
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, hs.URL+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer secret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("PUT %s: %s, want %d", c.path, resp.Status, c.want)
		}
	}
}
