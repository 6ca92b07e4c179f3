package admission

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fleetcap/fleetcap/ratelimit"
)

// lowered is Sizes with every cap's capacity in force set to capacity, as
// an operator's override would.
type lowered struct{ capacity int }

func (s lowered) CapacityFor(string, string, int) (int, bool) { return s.capacity, true }
func (lowered) RateFor(_, _ string, configured ratelimit.Limit) (ratelimit.Limit, bool) {
	return configured, false
}

// TestForSeatsAndShare: Table.For sets each cap's seats (its cost, its
// payload's cost_from value, 1 by default), its fair share value and
// weight, and its max_waiting; two caps of one key take the more seats and
// the tighter bound; a payload that cannot give them is an error naming
// the field; a cost above a capacity an operator lowered is not one.
func TestForSeatsAndShare(t *testing.T) {
	table := tableFor(t, `
tasks:
  a:
    semaphores:
      - {key: "tenant:{tenant_id}", capacity: 5, fair_by: "{tenant_id}", weights: {acme: 3}, cost_from: pages, max_waiting: 100}
      - {key: global, capacity: 8, cost: 2}
      - {key: "all:{region}", capacity: 4, max_waiting: 50}
      - {key: "all:e{tail}", capacity: 6, cost: 3, max_waiting: 20}
    rate_limits: [{key: api, rate: 10, per: 1s}]
`)
	show := func(ls []Limit) string {
		var b []string
		for _, l := range ls {
			b = append(b, fmt.Sprintf("%s:%d seats %d share %q/%d max %d", l.Key, l.Capacity, l.Seats, l.Share, l.ShareWeight, l.MaxWaiting))
		}
		return strings.Join(b, "; ")
	}
	tests := []struct {
		payload string
		sizes   Sizes
		want    string
		wantErr string
	}{
		{payload: `{"tenant_id":"acme","pages":4,"region":"eu","tail":"u"}`,
			want: `all:eu:4 seats 3 share ""/1 max 20; global:8 seats 2 share ""/1 max 0; tenant:acme:5 seats 4 share "acme"/3 max 100; api:0 seats 0 share ""/0 max 0`},
		{payload: `{"tenant_id":"zeta","pages":1,"region":"eu","tail":"x"}`,
			want: `all:eu:4 seats 1 share ""/1 max 50; all:ex:6 seats 3 share ""/1 max 20; global:8 seats 2 share ""/1 max 0; tenant:zeta:5 seats 1 share "zeta"/1 max 100; api:0 seats 0 share ""/0 max 0`},
		{payload: `{"tenant_id":"acme","pages":5,"region":"eu","tail":"u"}`, sizes: lowered{capacity: 2},
			want: `all:eu:2 seats 3 share ""/1 max 20; global:2 seats 2 share ""/1 max 0; tenant:acme:2 seats 5 share "acme"/3 max 100; api:0 seats 0 share ""/0 max 0`},
		{payload: `{"tenant_id":"acme","pages":6,"region":"eu","tail":"u"}`,
			wantErr: `its payload cannot give its seats of semaphore "tenant:acme": cost_from: payload field "pages" is 6, want an integer in 1..5 (the capacity)`},
		{payload: `{"tenant_id":"acme","region":"eu","tail":"u"}`,
			wantErr: `its payload cannot give its seats of semaphore "tenant:acme": cost_from: payload field "pages" is missing`},
		{payload: `{"tenant_id":"acme","pages":"2","region":"eu","tail":"u"}`,
			wantErr: `cost_from: payload field "pages" is a string "2", want an integer in 1..5`},
	}
	for _, tt := range tests {
		got, err := table.For("a", []byte(tt.payload), tt.sizes)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err %v, want %q", tt.payload, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tt.payload, err)
		case show(got) != tt.want:
			t.Errorf("%s:\n got %s\nwant %s", tt.payload, show(got), tt.want)
		}
	}

	// fair_by's field missing: bad input too.
	table = tableFor(t, `tasks: {b: {semaphore: {key: hooks, capacity: 2, fair_by: "{tenant.id}"}}}`)
	_, err := table.For("b", []byte(`{"tenant":"acme"}`), nil)
	if want := `its payload cannot render the fair share of semaphore "hooks": fair_by template "{tenant.id}": payload field "tenant.id": "tenant" is a string, not an object`; err == nil || err.Error() != want {
		t.Errorf("err %v\nwant %s", err, want)
	}
}
