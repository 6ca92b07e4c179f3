package monitoring

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/ratelimit"
)

const adminToken = "s3cret-admin"

var (
	stripeLimit = ratelimit.Limit{Rate: 10, Per: time.Second, Burst: 4}
	slackLimit  = ratelimit.Limit{Rate: 1, Per: time.Minute, Burst: 2}
)

// controlFixture serves caps (plain, a template and rendered keys) and
// rate limits (plain and a template) with runtime overrides on.
func controlFixture(t *testing.T, token string) *fixture {
	t.Helper()
	return newFixture(t, fixtureOptions{
		adminToken: token,
		overrides:  true,
		keys: []KeyInfo{
			{Key: "legacy-api", Capacity: 5},
			{Key: "reports/eu", Capacity: 2},
			{Key: "tenant:{tenant_id}", Capacity: 2, Template: "tenant:{tenant_id}"},
			{Key: "tenant:acme", Capacity: 2, Template: "tenant:{tenant_id}"},
		},
		rateKeys: []RateKeyInfo{
			{Key: "slack", Limit: slackLimit, MaxCost: 1},
			{Key: "stripe:{account_id}", Template: "stripe:{account_id}", Limit: stripeLimit, MaxCost: 3},
			{Key: "stripe:acct_1", Template: "stripe:{account_id}", Limit: stripeLimit, MaxCost: 3},
		},
	})
}

func TestOverrideEndpointsNeedTheAdminToken(t *testing.T) {
	paths := []struct{ method, path, body string }{
		{"PUT", "/api/semaphores/legacy-api/capacity", `{"capacity": 1}`},
		{"DELETE", "/api/semaphores/legacy-api/capacity", ""},
		{"PUT", "/api/ratelimits/slack", `{"rate": 1, "per": "1s", "burst": 1}`},
		{"DELETE", "/api/ratelimits/slack", ""},
	}
	t.Run("none configured", func(t *testing.T) {
		f := controlFixture(t, "")
		for _, p := range paths {
			if code, body := f.send(t, p.method, p.path, "Bearer anything", p.body); code != http.StatusNotFound {
				t.Errorf("%s %s without an admin token configured = %d %s, want 404", p.method, p.path, code, body)
			}
		}
	})
	t.Run("wrong or missing", func(t *testing.T) {
		f := controlFixture(t, adminToken)
		for _, p := range paths {
			for _, auth := range []string{"", "Bearer nope", "Basic " + adminToken} {
				if code, _ := f.send(t, p.method, p.path, auth, p.body); code != http.StatusUnauthorized {
					t.Errorf("%s %s with %q = %d, want 401", p.method, p.path, auth, code)
				}
			}
		}
		if o, err := f.store.Load(context.Background()); err != nil || len(o.Capacities)+len(o.Rates) != 0 {
			t.Errorf("overrides after refused requests: %+v, %v; want none", o, err)
		}
	})
}

func TestBadOverrideBodies(t *testing.T) {
	f := controlFixture(t, adminToken)
	const capPath, ratePath = "/api/semaphores/legacy-api/capacity", "/api/ratelimits/stripe:acct_1"
	for _, tc := range []struct {
		name, path, body, want string
	}{
		{"empty body", capPath, "", "the body is empty"},
		{"not JSON", capPath, "capacity=3", "not the JSON object expected"},
		{"a list", capPath, "[3]", "not the JSON object expected"},
		{"unknown field", capPath, `{"capacity": 3, "ttl": "1s"}`, `unknown field "ttl"`},
		{"misspelt field", capPath, `{"capacty": 3}`, `unknown field "capacty"`},
		{"capacity missing", capPath, `{}`, `"capacity" is required`},
		{"capacity null", capPath, `{"capacity": null}`, `"capacity" is required`},
		{"negative capacity", capPath, `{"capacity": -1}`, `"capacity" must be >= 0 (0 pauses the key), got -1`},
		{"capacity a string", capPath, `{"capacity": "3"}`, "cannot unmarshal string"},
		{"capacity a fraction", capPath, `{"capacity": 2.5}`, "cannot unmarshal number 2.5"},
		{"two objects", capPath, `{"capacity": 1} {"capacity": 2}`, "more than one JSON value"},
		{"huge body", capPath, `{"capacity": 1, "x": "` + strings.Repeat("a", 5000) + `"}`, "cannot read the body"},
		{"unknown semaphore key", "/api/semaphores/nope/capacity", `{"capacity": 1}`, `unknown semaphore key "nope"`},
		{"a rate key is no semaphore key", "/api/semaphores/slack/capacity", `{"capacity": 1}`, `unknown semaphore key "slack"`},
		{"rate missing", ratePath, `{"per": "1s", "burst": 3}`, `"rate" is required`},
		{"rate zero", ratePath, `{"rate": 0, "per": "1s", "burst": 3}`, `"rate" must be >= 1, got 0`},
		{"per missing", ratePath, `{"rate": 5, "burst": 3}`, `"per" is required`},
		{"per not a duration", ratePath, `{"rate": 5, "per": "second", "burst": 3}`, `"per" must be a duration > 0 such as "1s" or "1m", got "second"`},
		{"per negative", ratePath, `{"rate": 5, "per": "-1s", "burst": 3}`, `"per" must be a duration > 0`},
		{"per a number", ratePath, `{"rate": 5, "per": 1, "burst": 3}`, "cannot unmarshal number"},
		{"burst zero", ratePath, `{"rate": 5, "per": "1s", "burst": 0}`, `"burst" must be >= 1, got 0`},
		{"burst below the cost", ratePath, `{"rate": 5, "per": "1s", "burst": 2}`, `"burst" 2 is below the 3 tokens a task of key "stripe:acct_1" takes`},
		{"default burst below the cost", ratePath, `{"rate": 2, "per": "1s"}`, `"burst" 2 is below the 3 tokens`},
		{"rate finer than the clock", ratePath, `{"rate": 5000, "per": "1ms", "burst": 5}`, "more than one token every 1µs"},
		{"unknown rate field", ratePath, `{"rate": 5, "per": "1s", "burst": 3, "cost": 1}`, `unknown field "cost"`},
		{"unknown rate key", "/api/ratelimits/github", `{"rate": 5, "per": "1s", "burst": 3}`, `unknown rate-limit key "github"`},
		{"a semaphore key is no rate key", "/api/ratelimits/legacy-api", `{"rate": 5, "per": "1s", "burst": 3}`, `unknown rate-limit key "legacy-api"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := f.send(t, "PUT", tc.path, "Bearer "+adminToken, tc.body)
			var answer struct{ Error string }
			if err := json.Unmarshal([]byte(body), &answer); code != http.StatusBadRequest || err != nil || !strings.Contains(answer.Error, tc.want) {
				t.Errorf("PUT %s %s = %d %s, want 400 with an error saying %q", tc.path, tc.body, code, body, tc.want)
			}
		})
	}
	long := strings.Repeat("k", 1100)
	for _, path := range []string{"/api/semaphores/" + long + "/capacity", "/api/ratelimits/" + long} {
		if code, body := f.send(t, "DELETE", path, "Bearer "+adminToken, ""); code != http.StatusBadRequest || !strings.Contains(body, "longer than the 1024 allowed") {
			t.Errorf("DELETE of a %d-byte key = %d %s, want 400 naming the length", len(long), code, body)
		}
	}
	if o, err := f.store.Load(context.Background()); err != nil || len(o.Capacities)+len(o.Rates) != 0 {
		t.Errorf("overrides after bad requests: %+v, %v; want none", o, err)
	}
}

// rowsByKey fetches GET /api/semaphores and indexes its rows (and the
// busiest keys beneath template rows) by kind and key.
func rowsByKey(t *testing.T, f *fixture) map[string]map[string]any {
	t.Helper()
	code, body := f.do(t, "GET", "/api/semaphores", "")
	if code != http.StatusOK {
		t.Fatalf("GET /api/semaphores = %d %s", code, body)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	out := map[string]map[string]any{}
	var add func(rows []map[string]any)
	add = func(rows []map[string]any) {
		for _, r := range rows {
			out[r["kind"].(string)+" "+r["key"].(string)] = r
			if b, ok := r["busiest"].([]any); ok {
				var children []map[string]any
				for _, c := range b {
					children = append(children, c.(map[string]any))
				}
				add(children)
			}
		}
	}
	add(rows)
	return out
}

func TestCapacityOverrideThroughTheAPI(t *testing.T) {
	f := controlFixture(t, adminToken)
	f.hold(t, "tenant:acme", 2, 1, "acme") // so that tenant:acme is listed beneath its template
	auth := "Bearer " + adminToken
	put := func(key string, capacity int) map[string]any {
		t.Helper()
		code, body := f.send(t, "PUT", "/api/semaphores/"+url.PathEscape(key)+"/capacity", auth, `{"capacity": `+strconv.Itoa(capacity)+`}`)
		if code != http.StatusOK {
			t.Fatalf("PUT capacity of %s = %d %s", key, code, body)
		}
		return decodeObject(t, body)
	}
	check := func(row, want map[string]any) {
		t.Helper()
		for k, v := range want {
			if row[k] != v {
				t.Errorf("%v: %s = %v, want %v", row["key"], k, row[k], v)
			}
		}
	}

	check(put("legacy-api", 2), map[string]any{"key": "legacy-api", "capacity": 2.0, "configured_capacity": 5.0, "override": true})
	put("tenant:{tenant_id}", 1)
	put("reports/eu", 0) // a key with a slash, paused
	rows := rowsByKey(t, f)
	check(rows["semaphore legacy-api"], map[string]any{"capacity": 2.0, "configured_capacity": 5.0, "override": true})
	check(rows["semaphore reports/eu"], map[string]any{"capacity": 0.0, "configured_capacity": 2.0, "override": true})
	check(rows["semaphore tenant:{tenant_id}"], map[string]any{"capacity": 1.0, "configured_capacity": 2.0, "override": true})
	check(rows["semaphore tenant:acme"], map[string]any{"capacity": 1.0, "override": true}) // the template's override

	put("tenant:acme", 3) // the rendered key's own wins over its template's
	check(rowsByKey(t, f)["semaphore tenant:acme"], map[string]any{"capacity": 3.0, "configured_capacity": 2.0, "override": true})
	// A rendered key nobody listed yet is known through its template.
	check(put("tenant:initech", 4), map[string]any{"capacity": 4.0, "configured_capacity": 2.0})

	code, body := f.send(t, "DELETE", "/api/semaphores/legacy-api/capacity", auth, "")
	if code != http.StatusOK {
		t.Fatalf("DELETE = %d %s", code, body)
	}
	check(decodeObject(t, body), map[string]any{"capacity": 5.0, "override": false, "cleared": true})
	if _, body := f.send(t, "DELETE", "/api/semaphores/legacy-api/capacity", auth, ""); !strings.Contains(body, `"cleared":false`) {
		t.Errorf("second DELETE = %s, want cleared false", body)
	}
	check(rowsByKey(t, f)["semaphore legacy-api"], map[string]any{"capacity": 5.0, "override": false})

	// The overrides are in Redis, where every worker reads them.
	o, err := f.store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"reports/eu": 0, "tenant:{tenant_id}": 1, "tenant:acme": 3, "tenant:initech": 4}
	if len(o.Capacities) != len(want) {
		t.Errorf("stored capacities %v, want %v", o.Capacities, want)
	}
	for k, n := range want {
		if o.Capacities[k] != n {
			t.Errorf("stored capacity of %s = %d, want %d", k, o.Capacities[k], n)
		}
	}
	if !strings.Contains(f.logs.String(), "admin set a capacity override") {
		t.Errorf("override not logged:\n%s", f.logs)
	}
}

// TestClearingAnUndeclaredKey: an override left behind by a key the config
// no longer declares can still be cleared.
func TestClearingAnUndeclaredKey(t *testing.T) {
	f := controlFixture(t, adminToken)
	ctx := context.Background()
	if err := f.store.SetCapacity(ctx, "retired-api", 1); err != nil {
		t.Fatal(err)
	}
	if err := f.store.SetRate(ctx, "retired-rate", slackLimit); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/api/semaphores/retired-api/capacity", "/api/ratelimits/retired-rate"} {
		if code, body := f.send(t, "DELETE", path, "Bearer "+adminToken, ""); code != http.StatusOK || !strings.Contains(body, `"cleared":true`) {
			t.Errorf("DELETE %s = %d %s, want 200 cleared", path, code, body)
		}
	}
	if o, _ := f.store.Load(ctx); len(o.Capacities)+len(o.Rates) != 0 {
		t.Errorf("overrides left: %+v", o)
	}
}

func TestRateRowsAndRateOverride(t *testing.T) {
	f := controlFixture(t, adminToken)
	ctx := context.Background()
	if _, err := f.limiter.Take(ctx, "stripe:acct_1", stripeLimit, 3); err != nil {
		t.Fatal(err)
	}
	for key, tokens := range map[string][]string{"slack": {"q\x00a", "q\x00b"}, "stripe:acct_1": {"q\x00c"}} {
		for _, token := range tokens {
			if _, err := f.sem.PacedRooms(false).Park(ctx, key, token, time.Minute, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	rows := rowsByKey(t, f)
	slack := rows["rate slack"]
	if slack["rate"] != 1.0 || slack["per"] != "1m0s" || slack["burst"] != 2.0 || slack["remaining"] != 2.0 || slack["override"] != false || slack["waiting"] != 2.0 {
		t.Errorf("slack row = %v, want 1 per 1m0s, burst 2, 2 remaining, no override, 2 waiting", slack)
	}
	tpl := rows["rate stripe:{account_id}"]
	if tpl["template"] != true || tpl["rate"] != 10.0 || tpl["keys"] != 1.0 || tpl["waiting"] != 1.0 {
		t.Errorf("template row = %v, want 1 key, 1 waiting", tpl)
	}
	if _, has := tpl["remaining"]; has {
		t.Errorf("template row has remaining: %v", tpl)
	}
	if acct := rows["rate stripe:acct_1"]; acct == nil || acct["remaining"] != 1.0 || acct["waiting"] != 1.0 {
		t.Errorf("stripe:acct_1 row = %v, want 1 of 4 tokens left and 1 waiting, beneath its template", acct)
	}

	code, body := f.send(t, "PUT", "/api/ratelimits/"+url.PathEscape("stripe:{account_id}"), "Bearer "+adminToken, `{"rate": 20, "per": "1m", "burst": 3}`)
	if code != http.StatusOK {
		t.Fatalf("PUT rate = %d %s", code, body)
	}
	got := decodeObject(t, body)
	if r := got["rate"].(map[string]any); r["rate"] != 20.0 || r["per"] != "1m0s" || r["burst"] != 3.0 || got["override"] != true {
		t.Errorf("PUT answer = %s", body)
	}
	rows = rowsByKey(t, f)
	for _, key := range []string{"stripe:{account_id}", "stripe:acct_1"} {
		if r := rows["rate "+key]; r["rate"] != 20.0 || r["per"] != "1m0s" || r["burst"] != 3.0 || r["override"] != true {
			t.Errorf("%s after the template's override = %v", key, r)
		}
	}
	if cfg := rows["rate stripe:acct_1"]["configured"].(map[string]any); cfg["rate"] != 10.0 || cfg["per"] != "1s" {
		t.Errorf("configured of stripe:acct_1 = %v, want 10 per 1s", cfg)
	}
	// Burst defaults to rate.
	if code, body := f.send(t, "PUT", "/api/ratelimits/slack", "Bearer "+adminToken, `{"rate": 6, "per": "1s"}`); code != 200 || !strings.Contains(body, `"burst":6`) {
		t.Errorf("PUT without burst = %d %s, want burst 6", code, body)
	}
	if code, body := f.send(t, "DELETE", "/api/ratelimits/"+url.PathEscape("stripe:{account_id}"), "Bearer "+adminToken, ""); code != 200 || !strings.Contains(body, `"override":false`) {
		t.Errorf("DELETE rate = %d %s", code, body)
	}
	if r := rowsByKey(t, f)["rate stripe:acct_1"]; r["rate"] != 10.0 || r["override"] != false {
		t.Errorf("stripe:acct_1 after the clear = %v", r)
	}
}

func TestNewServerChecksControlOptions(t *testing.T) {
	ready := func(context.Context) error { return nil }
	limiter := &ratelimit.Limiter{}
	if _, err := NewServer(ServerOptions{Ready: ready, RateLimiter: limiter}); err == nil {
		t.Error("RateLimiter without RateKeys: want an error")
	}
	rateKeys := func(context.Context) ([]RateKeyInfo, error) { return nil, nil }
	if _, err := NewServer(ServerOptions{Ready: ready, RateLimiter: limiter, RateKeys: rateKeys}); err == nil {
		t.Error("RateLimiter without Semaphore: want an error")
	}
}

func decodeObject(t *testing.T, body string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return m
}

// FuzzOverrideBodies: no body panics the override endpoints' parsing, and
// whatever it accepts is a valid override.
func FuzzOverrideBodies(f *testing.F) {
	for _, seed := range []string{`{"capacity": 3}`, `{"rate": 10, "per": "1s", "burst": 2}`, `{"rate": 1, "per": "1ns"}`, `[]`, `{"per": "-1h"}`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req := httptest.NewRequest("PUT", "/", strings.NewReader(body))
		var c CapacityRequest
		if err := decodeBody(httptest.NewRecorder(), req, &c); err != nil && err.Error() == "" {
			t.Fatalf("empty error for %q", body)
		}
		req = httptest.NewRequest("PUT", "/", strings.NewReader(body))
		var r RateRequest
		if err := decodeBody(httptest.NewRecorder(), req, &r); err != nil {
			return
		}
		limit, err := r.limit()
		if err == nil {
			if verr := limit.Validate(); verr != nil {
				t.Fatalf("accepted %q as %s, which does not validate: %v", body, limit, verr)
			}
		} else if err.Error() == "" {
			t.Fatalf("empty error for %q", body)
		}
	})
}
