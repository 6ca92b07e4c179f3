package worker

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
)

func capTableFor(t *testing.T, yaml string) (*Worker, []capSpec) {
	t.Helper()
	cfg, err := ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	caps, err := newCapTable(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &Worker{recent: newRecentKeys(), caps: caps}, caps.byType["a"]
}

// TestSeatsFor: a task's caps render from its payload, in key order,
// overrides applied; two caps rendering one key are one seat of the
// smaller capacity; a payload that cannot render a key is an error naming
// the field. Validation keeps templates of one shape at one capacity; these
// two have different shapes and still render one key.
func TestSeatsFor(t *testing.T) {
	w, specs := capTableFor(t, `
tasks:
  a:
    semaphores:
      - {key: "zone:{to}", capacity: 3}
      - {key: "tenant:{tenant.id}", capacity: 2, capacity_overrides: {"tenant:acme": 4}}
      - {key: global, capacity: 5}
      - {key: "zone:e{from_tail}", capacity: 6}
`)
	tests := []struct {
		payload string
		want    string // key/capacity list
		wantErr string
	}{
		{payload: `{"tenant":{"id":"zeta"},"from_tail":"u","to":"us"}`, want: "global/5 tenant:zeta/2 zone:eu/6 zone:us/3"},
		{payload: `{"tenant":{"id":"acme"},"from_tail":"u","to":"eu"}`, want: "global/5 tenant:acme/4 zone:eu/3"},
		{payload: `{"tenant":{"id":7},"from_tail":true,"to":"x"}`, want: "global/5 tenant:7/2 zone:etrue/6 zone:x/3"},
		{payload: `{"from_tail":"u","to":"us"}`, wantErr: `key template "tenant:{tenant.id}": payload field "tenant.id" is missing`},
		{payload: `{"tenant":"acme","from_tail":"u","to":"us"}`, wantErr: `payload field "tenant.id": "tenant" is a string, not an object`},
		{payload: `{"tenant":{"id":{"x":1}},"from_tail":"u","to":"us"}`, wantErr: `payload field "tenant.id" is an object, want a string, number or boolean`},
	}
	for _, tt := range tests {
		seats, err := w.seatsFor(specs, asynq.NewTask("a", []byte(tt.payload)))
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
		for _, s := range seats {
			got = append(got, s.key+"/"+strconv.Itoa(s.capacity))
		}
		if strings.Join(got, " ") != tt.want {
			t.Errorf("%s: seats %q, want %q", tt.payload, got, tt.want)
		}
	}
	// Rendered keys are listed for monitoring, with their template.
	found := false
	for _, k := range w.DeclaredKeys() {
		if k.Key == "tenant:acme" && k.Template == "tenant:{tenant.id}" && k.Capacity == 4 {
			found = true
		}
	}
	if !found {
		t.Errorf("DeclaredKeys %v lacks tenant:acme (template tenant:{tenant.id}, capacity 4)", w.DeclaredKeys())
	}
}

// TestAttemptOrder: seats this process found full lately are tried first,
// the rest in key order; a seat taken clears its hint.
func TestAttemptOrder(t *testing.T) {
	w, _ := capTableFor(t, "tasks: {a: {semaphore: {key: x, capacity: 1}}}\n")
	seats := []seat{{key: "global"}, {key: "tenant:a"}, {key: "zone:eu"}}
	if got := w.caps.attemptOrder(seats); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("order %v, want key order", got)
	}
	w.caps.markFull("zone:eu")
	w.caps.markFull("tenant:a")
	if got := w.caps.attemptOrder(seats); !slices.Equal(got, []int{1, 2, 0}) {
		t.Errorf("order %v, want the full ones first, in key order", got)
	}
	w.caps.markFree("tenant:a")
	if got := w.caps.attemptOrder(seats); !slices.Equal(got, []int{2, 0, 1}) {
		t.Errorf("order %v, want zone:eu first", got)
	}
	for i := range 2 * fullHintMax {
		w.caps.markFull("k" + strconv.Itoa(i))
	}
	if n := len(w.caps.fullAt); n > fullHintMax {
		t.Errorf("%d full hints kept, want at most %d", n, fullHintMax)
	}
}

// TestDeclaredKeysBounded: with thousands of tenants, DeclaredKeys lists
// the plain keys and templates, every rendered key this process holds a
// seat of (however old), and only the most recent others; KeyLabel maps
// any rendered key to its template, remembered or not.
func TestDeclaredKeysBounded(t *testing.T) {
	w, specs := capTableFor(t, `
tasks:
  a:
    semaphores:
      - {key: global, capacity: 50}
      - {key: "tenant:{tenant_id}", capacity: 2}
`)
	render := func(tenant string) []seat {
		seats, err := w.seatsFor(specs, asynq.NewTask("a", []byte(`{"tenant_id":"`+tenant+`"}`)))
		if err != nil {
			t.Fatal(err)
		}
		return seats
	}
	render("held-long")
	w.recent.hold("tenant:held-long", "tenant:{tenant_id}", 2, 1)
	for i := range recentMax + 5000 { // more tenants than recentMax
		render("t" + strconv.Itoa(i))
	}
	w.recent.hold("tenant:held-new", "tenant:{tenant_id}", 2, 1) // held, not rendered here
	for i := range 5000 {
		render("t" + strconv.Itoa(i))
	}
	keys := w.DeclaredKeys()
	if n := len(keys); n > 2+2+recentListMax {
		t.Fatalf("DeclaredKeys lists %d keys, want at most %d", n, 2+2+recentListMax)
	}
	if n := len(w.recent.keys); n > recentMax+2 {
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
	w.recent.hold("tenant:held-long", "tenant:{tenant_id}", 2, -1)
	w.recent.hold("tenant:held-new", "tenant:{tenant_id}", 2, -1)
	if len(w.recent.held) != 0 {
		t.Errorf("held keys after release: %v", w.recent.held)
	}
	for key, want := range map[string]string{
		"tenant:t17": "tenant:{tenant_id}", "tenant:never-seen": "tenant:{tenant_id}",
		"global": "global", "other": "other",
	} {
		if got := w.KeyLabel(key); got != want {
			t.Errorf("KeyLabel(%q) = %q, want %q", key, got, want)
		}
	}
}
