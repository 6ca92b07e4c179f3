package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/producer"
	"github.com/fleetcap/fleetcap/tasks"
)

// TestOverridesThroughTheWorkersAPI: the worker serves the override API
// over its config's keys: a capacity override of a rendered key lands in
// Redis, an unknown key is refused, and /api/semaphores has a row per
// rate-limit key.
func TestOverridesThroughTheWorkersAPI(t *testing.T) {
	srv := redistest.Start(t)
	path := writeConfig(t, `redis: {url: "`+srv.URL()+`"}
monitoring: {addr: "127.0.0.1:0", admin_token: tok}
tasks:
  report:fetch:
    semaphores:
      - {key: legacy-api, capacity: 5}
      - {key: "tenant:{tenant_id}", capacity: 2}
    rate_limits:
      - {key: "reports:{tenant_id}", rate: 10, per: 1s, burst: 4, cost: 2}
`)
	base, stop := startWorker(t, path)
	defer stop()

	send := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := send("PUT", "/api/semaphores/tenant:acme/capacity", `{"capacity": 0}`); code != 200 || !strings.Contains(body, `"configured_capacity":2`) {
		t.Fatalf("PUT capacity of tenant:acme = %d %s", code, body)
	}
	if code, body := send("PUT", "/api/semaphores/other/capacity", `{"capacity": 1}`); code != 400 || !strings.Contains(body, `unknown semaphore key \"other\"`) {
		t.Errorf("PUT capacity of an undeclared key = %d %s, want 400", code, body)
	}
	if code, body := send("PUT", "/api/ratelimits/"+url.PathEscape("reports:{tenant_id}"), `{"rate": 5, "per": "1s", "burst": 1}`); code != 400 || !strings.Contains(body, "below the 2 tokens") {
		t.Errorf("PUT a burst below the cost = %d %s, want 400", code, body)
	}
	if code, body := send("PUT", "/api/ratelimits/reports:acme", `{"rate": 5, "per": "1s", "burst": 2}`); code != 200 {
		t.Errorf("PUT rate of reports:acme = %d %s", code, body)
	}

	store, err := control.NewStore(srv.Client(), control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o, err := store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := o.Capacities["tenant:acme"]; !ok || n != 0 || o.Rates["reports:acme"].Rate != 5 {
		t.Errorf("stored overrides = %+v, want tenant:acme paused and reports:acme at 5/s", o)
	}

	code, body := send("GET", "/api/semaphores", "")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(body), &rows); code != 200 || err != nil {
		t.Fatalf("GET /api/semaphores = %d %s (%v)", code, body, err)
	}
	var kinds []string
	for _, r := range rows {
		kinds = append(kinds, r["kind"].(string)+" "+r["key"].(string))
	}
	if got := strings.Join(kinds, ", "); !strings.Contains(got, "semaphore legacy-api") || !strings.Contains(got, "rate reports:{tenant_id}") {
		t.Errorf("rows = %s, want the caps and the rate limit's template", got)
	}

	// A task that takes tokens of a rendered key puts that key on the page,
	// under its template (the busiest ones are listed while in use).
	cfg, err := config.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := producer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Enqueue(context.Background(), tasks.TypeReportFetch, []byte(`{"tenant_id":"globex","duration_ms":1}`)); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 20*time.Second, "the template's row counts the rendered rate-limit key", func() bool {
		_, body := send("GET", "/api/semaphores", "")
		return strings.Contains(body, `"key":"reports:{tenant_id}","rate":10,"per":"1s","burst":4,"configured":{"rate":10,"per":"1s","burst":4},"override":false,"waiting":0,"template":true,"keys":1`)
	})
}
