package admission

import (
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/ratelimit"
)

// TestRatePace: a Gate sends tasks of a rate limit straight to their queue
// up to the limit's burst and rate, and holds the next ones back; once it
// parked tasks, it holds every new one back until those are due (the count
// in the room times the interval), however long that is, so that none
// overtakes them; then it sends them straight again.
func TestRatePace(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	p := newRatePace()
	p.clock = func() time.Time { return now }
	l := Limit{Spec: Spec{Kind: KindRate}, Key: "api", Rate: ratelimit.Limit{Rate: 10, Per: time.Second, Burst: 2}}
	l.Spec.Rate.Cost = 1
	at := func(d time.Duration, want bool) {
		t.Helper()
		if got := p.busy(l); got != want {
			t.Fatalf("at +%s: busy = %v, want %v", d, got, want)
		}
	}
	start := now
	for i, want := range []bool{false, false, true} { // the burst, then the pace
		at(time.Duration(i), want)
	}
	p.parked(l, 30) // 30 wait in the room: due over 3s
	for _, d := range []time.Duration{100 * time.Millisecond, 1500 * time.Millisecond, 2900 * time.Millisecond} {
		now = start.Add(d) // the bucket is full again long before
		at(d, true)
	}
	now = start.Add(3100 * time.Millisecond)
	at(3100*time.Millisecond, false)
}
