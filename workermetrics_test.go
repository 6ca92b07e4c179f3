// A real worker's /metrics with a backlog behind a full cap: what the
// alerts read, and promtool's lint of it.
package fleetcap_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/metricstest"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
)

// readmeKeptNames are the metric names that the README's paragraph on
// `promtool check metrics` says are kept although promtool reports them:
// the backquoted names in it that the worker exports.
func readmeKeptNames(t *testing.T, exported map[string]bool) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var para string
	for _, p := range strings.Split(string(b), "\n\n") {
		if strings.Contains(p, "`promtool check metrics`") {
			para = p
			break
		}
	}
	if para == "" {
		t.Fatal("README.md has no paragraph on `promtool check metrics`")
	}
	var names []string
	for _, m := range regexp.MustCompile("`([a-z_:][a-z0-9_:]*)`").FindAllStringSubmatch(para, -1) {
		if exported[m[1]] && !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	slices.Sort(names)
	return names
}

// TestWorkerMetrics runs the worker binary with a cap of 1 and enqueues a
// backlog with the enqueue command (the producer: the tasks that find the
// cap busy are enqueued to wait, never dequeued nor requeued). Its
// /metrics shows the backlog from the waiting room, fleetcap_semaphore_
// tasks_waiting, _standby and _oldest_wait_seconds, as /api/semaphores
// does, while fleetcap_tasks_requeued_total stays at 0; and promtool check
// metrics on that /metrics finds nothing but the names the README says are
// kept, which it must still find.
func TestWorkerMetrics(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeFile(t, "fleet.yaml", fmt.Sprintf(`redis: {url: %q}
worker: {concurrency: 4, shutdown_timeout: 2s}
monitoring: {addr: "127.0.0.1:0"}
tasks:
  report:fetch:
    semaphores:
      - {key: legacy-api, capacity: 1, ttl: 30s}
      - {key: "tenant:{tenant_id}", capacity: 5, ttl: 30s}
    rate_limits: [{key: reports, rate: 100, per: 1s}]
`, srv.URL()))
	env := []string{"FLEETCAP_REDIS_URL="}
	w, base := startWorker(t, env, cfg)
	code, stdout, stderr := runCmd(t, nil, env, enqueueBin, "--config", cfg, "--count", "5", "report:fetch", `{"tenant_id":"acme","duration_ms":30000}`)
	if code != 0 {
		t.Fatalf("enqueue: exit %d, %s %s", code, stdout, stderr)
	}

	// One runs, four wait; the room's reading is cached for 5 s. The second
	// task went to its queue with a place kept on each cap (the producer's
	// Route), and counts as on its way to a tenant seat until a worker
	// takes it and finds legacy-api full: then it stands by there and
	// steps aside in the tenant's room.
	var text string
	waitfor.Condition(t, 30*time.Second, "/metrics shows 4 tasks waiting for legacy-api, none for the tenant", func() bool {
		text = getText(t, base+"/metrics")
		return strings.Contains(text, `fleetcap_semaphore_tasks_waiting{key="legacy-api"} 4`+"\n") &&
			strings.Contains(text, `fleetcap_semaphore_tasks_waiting{key="tenant:{tenant_id}"} 0`+"\n")
	})
	mfs, err := scrapeMetrics(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	value := func(name string, labels ...string) float64 {
		t.Helper()
		v, ok := metricstest.Sample(mfs, name, labels...)
		if !ok {
			t.Fatalf("no series %s%v on /metrics", name, labels)
		}
		return v
	}
	if v := value("fleetcap_semaphore_standby", "key", "legacy-api"); v < 0 || v > 1 {
		t.Errorf("standby places of legacy-api in use = %v, want at most its budget, 1", v)
	}
	if v := value("fleetcap_semaphore_oldest_wait_seconds", "key", "legacy-api"); v <= 0 {
		t.Errorf("oldest wait of legacy-api = %v with 4 tasks waiting, want > 0", v)
	}
	if v := value("fleetcap_semaphore_tasks_waiting", "key", "tenant:{tenant_id}"); v != 0 {
		t.Errorf("tasks waiting for the tenant template = %v, want 0 (5 seats each)", v)
	}
	if v := value("fleetcap_semaphore_rooms_up"); v != 1 {
		t.Errorf("fleetcap_semaphore_rooms_up = %v, want 1", v)
	}
	if v := value("fleetcap_tasks_requeued_total", "key", "legacy-api", "task_type", "report:fetch", "why", "full"); v != 0 {
		t.Errorf("requeued (full) = %v: the producer's tasks wait without being requeued, want 0", v)
	}
	type row struct {
		Key               string  `json:"key"`
		Waiting           int     `json:"waiting"`
		OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
	}
	var rows []row
	if err := json.Unmarshal([]byte(getText(t, base+"/api/semaphores")), &rows); err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(rows, func(r row) bool { return r.Key == "legacy-api" }); i < 0 || rows[i].Waiting < 1 || rows[i].OldestWaitSeconds <= 0 {
		t.Errorf("/api/semaphores: %+v, want legacy-api with tasks waiting and an oldest wait", rows)
	}

	code, out := promtool(t, ".", strings.NewReader(text), "check", "metrics")
	t.Logf("promtool check metrics (exit %d):\n%s", code, out)
	exported := map[string]bool{}
	for name := range mfs {
		exported[name] = true
	}
	var reported []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if name, _, ok := strings.Cut(line, " "); ok && exported[name] {
			if !slices.Contains(reported, name) {
				reported = append(reported, name)
			}
		} else if line != "" {
			t.Errorf("promtool check metrics: %q names no metric of the worker", line)
		}
	}
	slices.Sort(reported)
	if kept := readmeKeptNames(t, exported); !slices.Equal(reported, kept) {
		t.Errorf("promtool check metrics reports %q; the README says it reports only %q, kept on purpose", reported, kept)
	}
	if err := w.terminate(20 * time.Second); err != nil {
		t.Errorf("worker stop: %v", err)
	}
}

// getText GETs url and returns its body.
func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", url, resp.StatusCode, err)
	}
	return string(b)
}
