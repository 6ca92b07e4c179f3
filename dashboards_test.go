package fleetcap_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metricsql"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
)

// Where the dashboard and the alert rules live.
const (
	dashboardFile = "deploy/grafana/fleetcap.json"
	alertsFile    = "deploy/prometheus/alerts.yaml"
)

// metricNames returns the metric names an expression selects. The parser
// is MetricsQL's, a superset of PromQL without the dependencies of
// Prometheus's own (which needs its whole storage layer).
func metricNames(expr string) ([]string, error) {
	e, err := metricsql.Parse(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	metricsql.VisitAll(e, func(e metricsql.Expr) {
		me, ok := e.(*metricsql.MetricExpr)
		if !ok {
			return
		}
		for _, group := range me.LabelFilterss {
			for _, f := range group {
				if f.Label == "__name__" && !f.IsRegexp && !f.IsNegative {
					names = append(names, f.Value)
				}
			}
		}
	})
	if len(names) == 0 {
		return nil, fmt.Errorf("selects no metric by name")
	}
	return names, nil
}

// grafanaVar matches Grafana's interval variables, which stand where
// PromQL wants a duration.
var grafanaVar = regexp.MustCompile(`\$__(rate_interval|interval|range)\b`)

// labelValues matches a Grafana variable query label_values(metric, label).
var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)$`)

// dashboardExprs returns every PromQL expression of the dashboard (any
// "expr", at any depth: panels, rows' panels) and the metric of every
// label_values variable query, each with where it is.
func dashboardExprs(t *testing.T) (exprs map[string]string, varMetrics map[string]string) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	exprs, varMetrics = map[string]string{}, map[string]string{}
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["expr"].(string); ok {
				exprs[where] = e
			}
			if title, ok := v["title"].(string); ok {
				where += " > " + title
			}
			for k, c := range v {
				walk(where+"."+k, c)
			}
		case []any:
			for i, c := range v {
				walk(fmt.Sprintf("%s[%d]", where, i), c)
			}
		}
	}
	walk("panels", dash["panels"])
	templating, _ := dash["templating"].(map[string]any)
	vars, _ := templating["list"].([]any)
	for _, v := range vars {
		v, _ := v.(map[string]any)
		if v["type"] != "query" {
			continue
		}
		q := v["query"]
		if m, ok := q.(map[string]any); ok {
			q = m["query"]
		}
		qs, _ := q.(string)
		m := labelValues.FindStringSubmatch(qs)
		if m == nil {
			t.Errorf("%s: variable %v: query %q is not label_values(metric, label)", dashboardFile, v["name"], qs)
			continue
		}
		varMetrics[fmt.Sprintf("variable %v", v["name"])] = m[1]
	}
	if len(exprs) == 0 {
		t.Fatalf("%s: no expressions found", dashboardFile)
	}
	return exprs, varMetrics
}

// alertRules is the rule file's shape, strictly: an unknown field fails.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// alertExprs returns every alert's expression by alert name, after
// checking that each alert has a name, a severity, a summary and a
// description, and a valid for.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var rules alertRules
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	exprs := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			switch {
			case r.Alert == "" || r.Expr == "":
				t.Errorf("%s: group %s: a rule without alert or expr: %+v", alertsFile, g.Name, r)
			case r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "":
				t.Errorf("%s: %s: wants a severity label, a summary and a description", alertsFile, r.Alert)
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("%s: %s: for: %v", alertsFile, r.Alert, err)
				}
			}
			exprs[r.Alert] = r.Expr
		}
	}
	for _, want := range []string{"FleetcapLeaseLost", "FleetcapCapSaturated", "FleetcapCapWaitTooLong", "FleetcapRequeueStorm"} {
		if _, ok := exprs[want]; !ok {
			t.Errorf("%s: no alert %s", alertsFile, want)
		}
	}
	return exprs
}

// usedMetrics parses every expression of the dashboard and the rules and
// returns each metric name they use, with one place that uses it.
func usedMetrics(t *testing.T) map[string]string {
	t.Helper()
	used := map[string]string{}
	dash, vars := dashboardExprs(t)
	for where, m := range vars {
		used[m] = dashboardFile + ": " + where
	}
	add := func(file, where, expr string) {
		names, err := metricNames(grafanaVar.ReplaceAllString(expr, "5m"))
		if err != nil {
			t.Errorf("%s: %s: %q: %v", file, where, expr, err)
			return
		}
		for _, n := range names {
			used[n] = file + ": " + where
		}
	}
	for where, e := range dash {
		add(dashboardFile, where, e)
	}
	for alert, e := range alertExprs(t) {
		add(alertsFile, alert, e)
	}
	return used
}

// exported reports whether name is a series of the scraped families: a
// family's own name, or a histogram's _bucket, _sum or _count.
func exported(mfs map[string]*dto.MetricFamily, name string) bool {
	if mf, ok := mfs[name]; ok && len(mf.GetMetric()) > 0 {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if mf, found := mfs[base]; ok && found && len(mf.GetMetric()) > 0 &&
			(mf.GetType() == dto.MetricType_HISTOGRAM || mf.GetType() == dto.MetricType_SUMMARY) {
			return true
		}
	}
	return false
}

func scrapeMetrics(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// backlogMetrics are the series of the waiting rooms, read from Redis: the
// dashboard and the alerts must show the backlog behind a cap with them.
var backlogMetrics = []string{"fleetcap_semaphore_tasks_waiting", "fleetcap_semaphore_oldest_wait_seconds", "fleetcap_semaphore_standby"}

// TestDashboardAndAlertsUseExportedMetrics parses the Grafana dashboard
// and the Prometheus alert rules (every expression with a PromQL parser),
// checks that they show the backlog behind a cap (backlogMetrics, and the
// waiting rooms' reading in the Redis alert), then runs the worker binary
// through what makes each series appear (seats taken and waited for, tasks
// waiting behind a full semaphore, a force-release that loses a running
// task's lease) and finds every metric name they use on its /metrics. A
// panel or rule added later is checked the same way; one whose series
// only some event creates needs that event added here.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	used := usedMetrics(t)
	for _, name := range append(backlogMetrics, "fleetcap_semaphore_rooms_up") {
		if _, ok := used[name]; !ok {
			t.Errorf("neither %s nor %s uses %s: the backlog behind a cap goes unseen", dashboardFile, alertsFile, name)
		}
	}
	const token = "dash-token"
	srv := redistest.Start(t)
	cfg := writeFile(t, "fleet.yaml", fmt.Sprintf(`redis: {url: %q}
worker: {concurrency: 4, shutdown_timeout: 2s}
monitoring: {addr: "127.0.0.1:0"}
tasks:
  report:fetch:
    semaphore: {key: legacy-api, capacity: 1, ttl: 3s}
    rate_limits: [{key: reports, rate: 1, per: 1m, burst: 1}]
`, srv.URL()))
	env := []string{"FLEETCAP_REDIS_URL=", "FLEETCAP_ADMIN_TOKEN=" + token}
	w, base := startWorker(t, env, cfg)
	code, stdout, stderr := runCmd(t, nil, env, enqueueBin, "--config", cfg, "--count", "4", "report:fetch", `{"tenant_id":"acme","duration_ms":2500}`)
	if code != 0 {
		t.Fatalf("enqueue: exit %d, %s %s", code, stdout, stderr)
	}
	waitfor.Condition(t, 20*time.Second, "a task holds the seat", func() bool {
		resp, err := http.Get(base + "/api/semaphores")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var keys []struct{ Used int }
		return json.NewDecoder(resp.Body).Decode(&keys) == nil && len(keys) > 0 && keys[0].Used == 1
	})
	req, _ := http.NewRequest(http.MethodPost, base+"/api/semaphores/legacy-api/release-all", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("release-all: status %d", resp.StatusCode)
	}

	var missing []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		mfs, err := scrapeMetrics(base + "/metrics")
		missing = missing[:0]
		for name := range used {
			if err != nil || !exported(mfs, name) {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			slices.Sort(missing)
			for _, name := range missing {
				t.Errorf("%s (used by %s) is not on the worker's /metrics (scrape error %v)", name, used[name], err)
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(missing) == 0 {
		t.Logf("%d metric names used by %s and %s, all exported", len(used), dashboardFile, alertsFile)
	}
	if err := w.terminate(20 * time.Second); err != nil {
		t.Errorf("worker stop: %v", err)
	}
}
