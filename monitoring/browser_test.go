package monitoring

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
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
// returns its standard output.
func runChromium(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	common := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(),
		"--virtual-time-budget=3000",
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
	return f, legacyTasks
}

func TestSemaphoresPageInChromium(t *testing.T) {
	bin := chromiumPath(t)
	f, tasks := pageFixture(t)
	dom := runChromium(t, bin, "--dump-dom", f.http.URL+"/semaphores")

	for _, want := range append([]string{
		`data-key="legacy-api"`, "5 / 5", "FULL", "3 / 10", "0 / 3",
		"tenant:{tenant_id}", "tenant:acme", "2 / 2", "Live · updated",
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
