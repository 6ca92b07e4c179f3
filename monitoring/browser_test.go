package monitoring

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/semaphore"
)

// chromiumPath finds Chromium. Without it the test is skipped on a
// developer machine and fails in CI (CI set), where the page must be
// checked.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is required in CI (CI is set) but /usr/bin/chromium is missing: apt-get install -y chromium")
	}
	t.Skip("skipping the browser check: /usr/bin/chromium is missing (apt-get install -y chromium; with CI set this test fails instead)")
	return ""
}

// runChromium runs headless Chromium with args after the common flags and
// returns its standard output; pages get 3 s of virtual time.
func runChromium(t *testing.T, bin string, args ...string) string {
	t.Helper()
	return runChromiumFor(t, bin, 3*time.Second, args...)
}

// runChromiumFor is runChromium with budget of virtual time (it does not
// pass while a request is under way).
func runChromiumFor(t *testing.T, bin string, budget time.Duration, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	common := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(),
		"--virtual-time-budget=" + strconv.FormatInt(budget.Milliseconds(), 10),
	}
	cmd := exec.CommandContext(ctx, bin, append(common, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return string(out)
}

// pageFixture serves the semaphores page with legacy-api full (5 of 5),
// a half-used key and a per-tenant template.
func pageFixture(t *testing.T) (*fixture, []string) {
	t.Helper()
	f := newFixture(t, fixtureOptions{keys: []KeyInfo{
		{Key: "legacy-api", Capacity: 5},
		{Key: "geocoder", Capacity: 10},
		{Key: "mailer", Capacity: 3},
		{Key: "tenant:{tenant_id}", Capacity: 2, Template: "tenant:{tenant_id}"},
		{Key: "tenant:acme", Capacity: 2, Template: "tenant:{tenant_id}"},
		{Key: "tenant:globex", Capacity: 2, Template: "tenant:{tenant_id}"},
		{Key: "tenant:initech", Capacity: 2, Template: "tenant:{tenant_id}"},
	}})
	legacyTasks := []string{
		"7f3c2a91-5d4e-4b1a-9c0f-2e8b6d1a4c37",
		"a12e9b04-3f6c-4d2e-8a7b-91c5e0f3d268",
		"c4d8e1f2-6a3b-4c5d-9e0f-7b8a2c1d3e49",
		"e90b7c3d-2f1a-4e6b-8d5c-3a4f9e0b1c72",
		"1b6f4e2a-8c9d-4a3e-b7f0-5d2c8e1a6f93",
	}
	take := func(key string, capacity int, ttl time.Duration, task string) {
		t.Helper()
		p, err := f.sem.TryAcquire(context.Background(), key, capacity, semaphore.WithHolder(task), semaphore.WithTTL(ttl))
		if err != nil || p == nil {
			t.Fatalf("take %s for %s: %v, %v", key, task, p, err)
		}
	}
	for i, task := range legacyTasks {
		take("legacy-api", 5, time.Duration(25+9*i)*time.Second, task)
	}
	take("geocoder", 10, 40*time.Second, "3e5a7c9b-1d2f-4a6e-8b0c-4f7d9e2a5b18")
	take("geocoder", 10, 52*time.Second, "6d8f0a2c-4e1b-4c7d-9a3e-8b5f1c7d0e24")
	take("geocoder", 10, 58*time.Second, "9a1c3e5f-7b2d-4e8a-b6c0-2d4f6a8c0e31")
	take("tenant:acme", 2, 45*time.Second, "b2d4f6a8-0c1e-4a3b-9d5f-7e9a1b3c5d66")
	take("tenant:acme", 2, 57*time.Second, "d4f6a8c0-2e3a-4b5c-8f7e-9a1b3c5d7e80")
	take("tenant:globex", 2, 33*time.Second, "f6a8c0e2-4a5b-4c6d-a0f1-2b3c4d5e6f71")
	// Behind the full legacy-api, 12 tasks wait: 5 stand by in worker
	// slots (the standby budget), 7 wait in Redis; 3 wait for tenant:acme.
	room := func(standby int) semaphore.Room {
		return semaphore.Room{Standby: standby, Hold: 10 * time.Minute, Transit: 10 * time.Minute, TTL: 10 * time.Minute}
	}
	var waiting []string
	for i := range 12 {
		waiting = append(waiting, fmt.Sprintf("5e%02d41c7-9b3a-4f2e-8d6c-%012x", i, 0x7a1b3c5d9e00+i))
	}
	f.waitIn(t, "legacy-api", 5, room(5), waiting...)
	f.waitIn(t, "tenant:acme", 2, room(2), "0c9e7a5b-3d1f-4b2a-9e8c-6a4f2d0b8e13", "2e0a8c6d-4f2b-4c3e-8a9d-7b5e3f1c9d24", "4f1b9d7e-5a3c-4d4f-9b0e-8c6f4a2d0e35")
	return f, legacyTasks
}

func TestSemaphoresPageInChromium(t *testing.T) {
	bin := chromiumPath(t)
	f, tasks := pageFixture(t)
	dom := runChromium(t, bin, "--dump-dom", f.http.URL+"/semaphores")

	for _, want := range append([]string{
		`data-key="legacy-api"`, "5 / 5", "FULL", "3 / 10", "0 / 3",
		"tenant:{tenant_id}", "tenant:acme", "2 / 2", "Live · updated",
		"12 waiting", "5 standing by", "3 waiting", "2 standing by", "oldest ", "Tasks waiting", "Oldest wait", ">15<",
	}, tasks...) {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	// Busiest first: the full legacy-api row comes before the others.
	if i, j := strings.Index(dom, `data-key="legacy-api"`), strings.Index(dom, `data-key="geocoder"`); i < 0 || j < 0 || i > j {
		t.Errorf("legacy-api (5/5) should be listed before geocoder (3/10)")
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}

	// FLEETCAP_SCREENSHOT=path also saves a picture of the page (the one in
	// docs/semaphores.png comes from here).
	if shot := os.Getenv("FLEETCAP_SCREENSHOT"); shot != "" {
		abs, err := filepath.Abs(shot)
		if err != nil {
			t.Fatal(err)
		}
		runChromium(t, bin, "--screenshot="+abs, "--window-size=1200,700", f.http.URL+"/semaphores")
		if st, err := os.Stat(abs); err != nil || st.Size() == 0 {
			t.Fatalf("screenshot %s not written: %v", abs, err)
		}
		t.Logf("screenshot saved to %s", abs)
	}
}

// TestOverrideFormInChromium has an operator's browser drive the page's
// override form: a wrong token is refused, a capacity override, a pause of
// a template, a refused bad value, a rate override, the edit button and a
// clear. Each change must land in Redis and show on the page.
func TestOverrideFormInChromium(t *testing.T) {
	bin := chromiumPath(t)
	harness, err := os.ReadFile("testdata/harness.html")
	if err != nil {
		t.Fatal(err)
	}
	page := strings.Replace(string(harness), "__TOKEN__", adminToken, 1)
	f := newFixture(t, fixtureOptions{
		adminToken: adminToken,
		overrides:  true,
		keys: []KeyInfo{
			{Key: "legacy-api", Capacity: 5},
			{Key: "geocoder", Capacity: 10},
			{Key: "tenant:{tenant_id}", Capacity: 2, Template: "tenant:{tenant_id}"},
		},
		rateKeys: []RateKeyInfo{
			{Key: "slack", Limit: slackLimit, MaxCost: 1},
			{Key: "stripe:{account_id}", Template: "stripe:{account_id}", Limit: stripeLimit, MaxCost: 1},
		},
		wrap: func(h http.Handler) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("/", h)
			mux.HandleFunc("GET /harness", func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/html; charset=utf-8")
				_, _ = io.WriteString(w, page)
			})
			return mux
		},
	})
	dom := runChromiumFor(t, bin, 30*time.Second, "--dump-dom", f.http.URL+"/harness")
	start := strings.Index(dom, `<pre id="out">`)
	end := strings.Index(dom, "</pre>")
	if start < 0 || end < start {
		t.Fatalf("no output in the harness page:\n%s", dom)
	}
	out := html.UnescapeString(dom[start+len(`<pre id="out">`) : end])
	t.Logf("harness:\n%s", out)
	if !strings.HasPrefix(out, "DONE") {
		t.Fatalf("the harness did not finish")
	}
	for _, want := range []string{
		"admin panel shown: true",
		"form hidden before a token: true",
		"edit buttons before a token: 0",
		"result: PUT refused (401): missing or wrong admin token",
		"result: capacity of legacy-api is now 2 (override; configured 5)",
		"legacy-api row: 0 / 2OVERRIDE",
		"result: capacity of tenant:{tenant_id} is now 0 (override; configured 2)",
		"PAUSED",
		"the browser refuses capacity -1: true",
		`result: PUT refused (400): unknown semaphore key "nope"`,
		"result: rate of stripe:{account_id} is now 20 per 1m0s · burst 3 (override; configured 10 per 1s · burst 4)",
		"edit slack fills: rate slack 1 1m0s 2",
		"result: Override of legacy-api cleared; capacity of legacy-api is now 5 (as configured)",
		"legacy-api row: 0 / 5",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("harness output lacks %q", want)
		}
	}
	// FLEETCAP_SCREENSHOT_FORM=path saves a picture of the harness (the
	// page in its frame) once it is done.
	if shot := os.Getenv("FLEETCAP_SCREENSHOT_FORM"); shot != "" {
		abs, err := filepath.Abs(shot)
		if err != nil {
			t.Fatal(err)
		}
		runChromiumFor(t, bin, 30*time.Second, "--screenshot="+abs, "--window-size=1240,960", f.http.URL+"/harness")
		t.Logf("screenshot saved to %s", abs)
	}
	o, err := f.store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Capacities) != 1 || o.Capacities["tenant:{tenant_id}"] != 0 {
		t.Errorf("stored capacities = %v, want only tenant:{tenant_id} paused", o.Capacities)
	}
	if l := o.Rates["stripe:{account_id}"]; len(o.Rates) != 1 || l.Rate != 20 || l.Per != time.Minute || l.Burst != 3 {
		t.Errorf("stored rates = %v, want stripe:{account_id} at 20 per 1m (burst 3)", o.Rates)
	}
}
