package admission

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetcap/fleetcap/config"
)

// admitterFor is an Admitter of the config yaml with no Redis behind it:
// enough to render limits and keep its records.
func admitterFor(t *testing.T, yaml string) *Admitter {
	t.Helper()
	return &Admitter{Options: Options{Table: tableFor(t, yaml)}, full: newFullHints(), recentCaps: newRecentKeys(), recentRates: newRecentKeys()}
}

// tableFor is the Table of the config yaml.
func tableFor(t testing.TB, yaml string) *Table {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	table, err := NewTable(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// TestLimitsFor: a task's caps render from its payload, in key order,
// overrides applied, then its rate limits; two caps rendering one key are
// one seat of the smaller capacity; a payload that cannot render a key is
// an error naming the field. Validation keeps templates of one shape at
// one capacity; these two have different shapes and still render one key.
func TestLimitsFor(t *testing.T) {
	a := admitterFor(t, `
tasks:
  a:
    semaphores:
      - {key: "zone:{to}", capacity: 3}
      - {key: "tenant:{tenant.id}", capacity: 2, capacity_overrides: {"tenant:acme": 4}}
      - {key: global, capacity: 5}
      - {key: "zone:e{from_tail}", capacity: 6}
    rate_limits:
      - {key: "api:{to}", rate: 10, per: 1s}
      - {key: "all-calls", rate: 100, per: 1s}
`)
	tests := []struct {
		payload string
		want    string // key/capacity list, then rate keys
		wantErr string
	}{
		{payload: `{"tenant":{"id":"zeta"},"from_tail":"u","to":"us"}`, want: "global/5 tenant:zeta/2 zone:eu/6 zone:us/3 all-calls api:us"},
		{payload: `{"tenant":{"id":"acme"},"from_tail":"u","to":"eu"}`, want: "global/5 tenant:acme/4 zone:eu/3 all-calls api:eu"},
		{payload: `{"tenant":{"id":7},"from_tail":true,"to":"x"}`, want: "global/5 tenant:7/2 zone:etrue/6 zone:x/3 all-calls api:x"},
		{payload: `{"from_tail":"u","to":"us"}`, wantErr: `its payload cannot render its semaphore key: key template "tenant:{tenant.id}": payload field "tenant.id" is missing`},
		{payload: `{"tenant":"acme","from_tail":"u","to":"us"}`, wantErr: `payload field "tenant.id": "tenant" is a string, not an object`},
		{payload: `{"tenant":{"id":{"x":1}},"from_tail":"u","to":"us"}`, wantErr: `payload field "tenant.id" is an object, want a string, number or boolean`},
	}
	for _, tt := range tests {
		caps, rates, err := a.limitsFor("a", []byte(tt.payload))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err %v, want %q", tt.payload, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.payload, err)
			continue
		}
		var got []string
		for _, l := range caps {
			got = append(got, l.Key+"/"+strconv.Itoa(l.Capacity))
		}
		for _, l := range rates {
			got = append(got, l.Key)
		}
		if strings.Join(got, " ") != tt.want {
			t.Errorf("%s: limits %q, want %q", tt.payload, got, tt.want)
		}
	}
	// Rendered keys are listed for monitoring, with their template.
	found := false
	for _, k := range a.DeclaredKeys() {
		if k.Key == "tenant:acme" && k.Template == "tenant:{tenant.id}" && k.Capacity == 4 {
			found = true
		}
	}
	if !found {
		t.Errorf("DeclaredKeys %v lacks tenant:acme (template tenant:{tenant.id}, capacity 4)", a.DeclaredKeys())
	}
	if got := a.RenderedRateKeys(); !slices.Contains(got, "api:eu") || slices.Contains(got, "all-calls") {
		t.Errorf("RenderedRateKeys %v, want the rendered api:eu and not the plain all-calls", got)
	}
}

// TestFullHintsOrder: seats this process found full lately are tried
// first, the rest in key order; a seat taken clears its hint. (The hints'
// bound is package lately's.)
func TestFullHintsOrder(t *testing.T) {
	h := newFullHints()
	seats := []heldSeat{{Limit: Limit{Key: "global"}}, {Limit: Limit{Key: "tenant:a"}}, {Limit: Limit{Key: "zone:eu"}}}
	if got := h.order(seats); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("order %v, want key order", got)
	}
	h.Mark("zone:eu")
	h.Mark("tenant:a")
	if got := h.order(seats); !slices.Equal(got, []int{1, 2, 0}) {
		t.Errorf("order %v, want the full ones first, in key order", got)
	}
	h.Forget("tenant:a")
	if got := h.order(seats); !slices.Equal(got, []int{2, 0, 1}) {
		t.Errorf("order %v, want zone:eu first", got)
	}
}

// TestDeclaredKeysBounded: with thousands of tenants, DeclaredKeys lists
// the plain keys and templates, every rendered key this process holds a
// seat of (however old), and only the most recent others; KeyLabel maps
// any rendered key to its template, remembered or not.
func TestDeclaredKeysBounded(t *testing.T) {
	a := admitterFor(t, `
tasks:
  a:
    semaphores:
      - {key: global, capacity: 50}
      - {key: "tenant:{tenant_id}", capacity: 2}
`)
	render := func(tenant string) {
		if _, _, err := a.limitsFor("a", []byte(`{"tenant_id":"`+tenant+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
	render("held-long")
	a.recentCaps.hold("tenant:held-long", "tenant:{tenant_id}", 2, 1)
	for i := range recentMax + 5000 { // more tenants than recentMax
		render("t" + strconv.Itoa(i))
	}
	a.recentCaps.hold("tenant:held-new", "tenant:{tenant_id}", 2, 1) // held, not rendered here
	for i := range 5000 {
		render("t" + strconv.Itoa(i))
	}
	keys := a.DeclaredKeys()
	if n := len(keys); n > 2+2+recentListMax {
		t.Fatalf("DeclaredKeys lists %d keys, want at most %d", n, 2+2+recentListMax)
	}
	if n := len(a.recentCaps.keys); n > recentMax+2 {
		t.Errorf("%d rendered keys remembered, want at most %d and the held ones", n, recentMax)
	}
	has := map[string]string{}
	for _, k := range keys {
		has[k.Key] = k.Template
	}
	for key, tmpl := range map[string]string{
		"global": "", "tenant:{tenant_id}": "tenant:{tenant_id}",
		"tenant:held-long": "tenant:{tenant_id}", "tenant:held-new": "tenant:{tenant_id}",
		"tenant:t4999": "tenant:{tenant_id}",
	} {
		if got, ok := has[key]; !ok || got != tmpl {
			t.Errorf("DeclaredKeys: %q listed %t with template %q, want template %q", key, ok, got, tmpl)
		}
	}
	if _, ok := has["tenant:t0"]; ok {
		t.Error("DeclaredKeys lists tenant:t0, one of the oldest of 5000 idle keys")
	}
	a.recentCaps.hold("tenant:held-long", "tenant:{tenant_id}", 2, -1)
	a.recentCaps.hold("tenant:held-new", "tenant:{tenant_id}", 2, -1)
	if len(a.recentCaps.held) != 0 {
		t.Errorf("held keys after release: %v", a.recentCaps.held)
	}
	for key, want := range map[string]string{
		"tenant:t17": "tenant:{tenant_id}", "tenant:never-seen": "tenant:{tenant_id}",
		"global": "global", "other": "other",
	} {
		if got := a.KeyLabel(key); got != want {
			t.Errorf("KeyLabel(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestTokens: a token's wire form reads back, and a string that is not
// one is an error.
func TestTokens(t *testing.T) {
	tok := Token{Queue: "critical", ID: "7b1c"}
	got, err := ParseToken(tok.String())
	if err != nil || got != tok {
		t.Fatalf("ParseToken(%q) = %v, %v; want %v", tok.String(), got, err, tok)
	}
	for _, bad := range []string{"", "critical", "\x00id", "queue\x00"} {
		if _, err := ParseToken(bad); err == nil {
			t.Errorf("ParseToken(%q): no error", bad)
		}
	}
}
