package worker

import (
	"slices"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/ratelimit"
)

func TestKeyIndex(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
tasks:
  invoice:sync:
    semaphores:
      - {key: stripe-conc, capacity: 20}
      - {key: "tenant:{tenant_id}", capacity: 2, capacity_overrides: {"tenant:acme": 4}}
    rate_limits:
      - {key: "stripe:{account_id}", rate: 100, per: 1s, burst: 20, rate_overrides: {"stripe:acct_big": 400}}
      - {key: slack, rate: 1, per: 1m, burst: 3}
  invoice:bulk:
    semaphore: {key: "tenant:acme", capacity: 4}
    rate_limits:
      - {key: "stripe:{account_id}", rate: 100, per: 1s, burst: 20, cost: 5, rate_overrides: {"stripe:acct_big": 400}}
`))
	if err != nil {
		t.Fatal(err)
	}
	x, err := NewKeyIndex(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		want DeclaredKey
		ok   bool
	}{
		{"stripe-conc", DeclaredKey{Key: "stripe-conc", Capacity: 20}, true},
		{"tenant:{tenant_id}", DeclaredKey{Key: "tenant:{tenant_id}", Capacity: 2, Template: "tenant:{tenant_id}"}, true},
		{"tenant:globex", DeclaredKey{Key: "tenant:globex", Capacity: 2, Template: "tenant:{tenant_id}"}, true},
		{"tenant:acme", DeclaredKey{Key: "tenant:acme", Capacity: 4}, true}, // the plain key wins
		{"stripe:{account_id}", DeclaredKey{}, false},                       // a rate key only
		{"tenant:", DeclaredKey{}, false},
		{"nope", DeclaredKey{}, false},
	} {
		if got, ok := x.LookupCap(c.key); got != c.want || ok != c.ok {
			t.Errorf("LookupCap(%q) = %+v, %v; want %+v, %v", c.key, got, ok, c.want, c.ok)
		}
	}

	stripe := ratelimit.Limit{Rate: 100, Per: time.Second, Burst: 20}
	big := ratelimit.Limit{Rate: 400, Per: time.Second, Burst: 20}
	slack := ratelimit.Limit{Rate: 1, Per: time.Minute, Burst: 3}
	for _, c := range []struct {
		key  string
		want DeclaredRateKey
		ok   bool
	}{
		{"slack", DeclaredRateKey{Key: "slack", Limit: slack, MaxCost: 1}, true},
		{"stripe:{account_id}", DeclaredRateKey{Key: "stripe:{account_id}", Template: "stripe:{account_id}", Limit: stripe, MaxCost: 5}, true},
		{"stripe:acct_1", DeclaredRateKey{Key: "stripe:acct_1", Template: "stripe:{account_id}", Limit: stripe, MaxCost: 5}, true},
		{"stripe:acct_big", DeclaredRateKey{Key: "stripe:acct_big", Template: "stripe:{account_id}", Limit: big, MaxCost: 5}, true},
		{"stripe-conc", DeclaredRateKey{}, false}, // a semaphore key only
	} {
		if got, ok := x.LookupRate(c.key); got != c.want || ok != c.ok {
			t.Errorf("LookupRate(%q) = %+v, %v; want %+v, %v", c.key, got, ok, c.want, c.ok)
		}
	}
	keys := x.RateKeys()
	if len(keys) != 2 || keys[0].Key != "slack" || keys[1].Key != "stripe:{account_id}" || keys[1].MaxCost != 5 {
		t.Errorf("RateKeys() = %+v, want slack then the stripe template (max cost 5)", keys)
	}
	for key, want := range map[string]string{"stripe:acct_1": "stripe:{account_id}", "slack": "slack", "other": "other"} {
		if got := x.RateKeyLabel(key); got != want {
			t.Errorf("RateKeyLabel(%q) = %q, want %q", key, got, want)
		}
	}
	capWhys := []RequeueReason{RequeueFull, RequeueTimeout, RequeueShutdown, RequeueLeaseLost, RequeueStoreError}
	rateWhys := []RequeueReason{RequeueRateLimited, RequeueStoreError}
	want := []TaskKey{
		{TaskType: "invoice:bulk", Key: "tenant:acme", Reasons: capWhys},
		{TaskType: "invoice:bulk", Key: "stripe:{account_id}", Rate: true, Reasons: rateWhys},
		{TaskType: "invoice:sync", Key: "stripe-conc", Reasons: capWhys},
		{TaskType: "invoice:sync", Key: "tenant:{tenant_id}", Reasons: capWhys},
		{TaskType: "invoice:sync", Key: "stripe:{account_id}", Rate: true, Reasons: rateWhys},
		{TaskType: "invoice:sync", Key: "slack", Rate: true, Reasons: rateWhys},
	}
	if got := x.TaskKeys(); !slices.EqualFunc(got, want, func(a, b TaskKey) bool {
		return a.TaskType == b.TaskType && a.Key == b.Key && a.Rate == b.Rate && slices.Equal(a.Reasons, b.Reasons)
	}) {
		t.Errorf("TaskKeys() =\n%+v\nwant\n%+v", got, want)
	}
}
