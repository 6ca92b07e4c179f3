package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// testRoom is a waiting room with one standby place whose places outlast
// any test.
var testRoom = semaphore.Room{Standby: 1, Hold: 10 * time.Minute, Transit: 10 * time.Minute, TTL: 10 * time.Minute}

// wait puts tokens in key's waiting room (testRoom) as a worker's tasks
// do: each Enters the full key, the first takes the standby place, the
// others are parked.
func (f *fixture) wait(t *testing.T, key string, capacity int, tokens ...string) {
	t.Helper()
	f.waitIn(t, key, capacity, testRoom, tokens...)
}

// waitIn is wait in room: the first room.Standby tokens stand by.
func (f *fixture) waitIn(t *testing.T, key string, capacity int, room semaphore.Room, tokens ...string) {
	t.Helper()
	for _, token := range tokens {
		e, err := f.sem.Enter(context.Background(), key, capacity, "default\x00"+token, room)
		if err != nil || e.Permit != nil {
			t.Fatalf("enter %s for %s: %+v, %v; want no seat", key, token, e, err)
		}
	}
}

// enqueueToWait puts a token in key's waiting room as the producer does
// for a task it enqueues to wait: no standby place free, so it is parked
// without its task ever being dequeued.
func (f *fixture) enqueueToWait(t *testing.T, key string, capacity int, token string) {
	t.Helper()
	ctx := context.Background()
	token = "default\x00" + token
	placed, err := f.sem.Reserve(ctx, key, capacity, token, testRoom)
	if err != nil || placed {
		t.Fatalf("reserve %s for %s: %v, %v; want no place", key, token, placed, err)
	}
	if _, err := f.sem.Park(ctx, key, capacity, token, testRoom); err != nil {
		t.Fatal(err)
	}
}

func roomOf(t *testing.T, f *fixture, key string) semaphore.RoomStats {
	t.Helper()
	st, err := f.sem.RoomStats(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestWaitingRoomsOnMetricsAndAPI: the tasks waiting behind a full cap,
// whether a worker sent them back or the producer enqueued them to wait,
// are counted from the waiting room on /metrics and /api/semaphores, with
// the oldest wait and the standby places in use; a template sums its
// rendered keys (the oldest wait: the longest) under its own label, and an
// idle key reads 0. A task stepped aside (its queue paused) is counted
// aside on /api/semaphores, not waiting.
func TestWaitingRoomsOnMetricsAndAPI(t *testing.T) {
	f := newFixture(t, fixtureOptions{keys: []KeyInfo{
		{Key: "legacy-api", Capacity: 1},
		{Key: "geocoder", Capacity: 10},
		{Key: "tenant:{tenant_id}", Capacity: 1, Template: "tenant:{tenant_id}"},
		{Key: "tenant:acme", Capacity: 1, Template: "tenant:{tenant_id}"},
		{Key: "tenant:globex", Capacity: 1, Template: "tenant:{tenant_id}"},
		{Key: "paused-queue", Capacity: 1},
	}})
	f.hold(t, "legacy-api", 1, 1, "running")
	f.wait(t, "legacy-api", 1, "a", "b", "c")
	f.enqueueToWait(t, "legacy-api", 1, "d")
	f.hold(t, "tenant:acme", 1, 1, "acme-running")
	f.wait(t, "tenant:acme", 1, "x", "y")
	f.hold(t, "tenant:globex", 1, 1, "globex-running")
	f.wait(t, "tenant:globex", 1, "w")
	f.enqueueToWait(t, "tenant:globex", 1, "z")
	// A task of a paused queue steps aside when its turn comes: counted
	// aside, not waiting.
	f.hold(t, "paused-queue", 1, 1, "paused-running")
	f.wait(t, "paused-queue", 1, "s")
	f.enqueueToWait(t, "paused-queue", 1, "p")
	if err := f.sem.StepAside(context.Background(), "paused-queue", "default\x00p"); err != nil {
		t.Fatal(err)
	}
	legacy, acme, globex := roomOf(t, f, "legacy-api"), roomOf(t, f, "tenant:acme"), roomOf(t, f, "tenant:globex")
	if legacy.Waiting != 4 || legacy.Standby != 1 || acme.Waiting != 2 || globex.Waiting != 2 {
		t.Fatalf("rooms: legacy-api %+v, tenant:acme %+v, tenant:globex %+v", legacy, acme, globex)
	}

	mfs := scrape(t, f.http.URL+"/metrics")
	for _, c := range []struct {
		name, key string
		want      float64
	}{
		{"fleetcap_semaphore_tasks_waiting", "legacy-api", 4},
		{"fleetcap_semaphore_standby", "legacy-api", 1},
		{"fleetcap_semaphore_tasks_waiting", "geocoder", 0},
		{"fleetcap_semaphore_standby", "geocoder", 0},
		{"fleetcap_semaphore_oldest_wait_seconds", "geocoder", 0},
		{"fleetcap_semaphore_tasks_waiting", "tenant:{tenant_id}", 4},
		{"fleetcap_semaphore_standby", "tenant:{tenant_id}", 2},
	} {
		if got := mustSample(t, mfs, c.name, "key", c.key); got != c.want {
			t.Errorf("%s{key=%q} = %v, want %v", c.name, c.key, got, c.want)
		}
	}
	if got := mustSample(t, mfs, "fleetcap_semaphore_oldest_wait_seconds", "key", "legacy-api"); got < legacy.OldestWait.Seconds() || got > legacy.OldestWait.Seconds()+60 {
		t.Errorf("oldest wait of legacy-api = %vs, want at least the %v read before", got, legacy.OldestWait)
	}
	if got, longest := mustSample(t, mfs, "fleetcap_semaphore_oldest_wait_seconds", "key", "tenant:{tenant_id}"), max(acme.OldestWait, globex.OldestWait); got < longest.Seconds() || got > longest.Seconds()+60 {
		t.Errorf("oldest wait of the template = %vs, want at least the longest of its keys, %v", got, longest)
	}
	if got := mustSample(t, mfs, "fleetcap_semaphore_rooms_up"); got != 1 {
		t.Errorf("fleetcap_semaphore_rooms_up = %v, want 1", got)
	}
	for _, name := range []string{"fleetcap_semaphore_tasks_waiting", "fleetcap_semaphore_oldest_wait_seconds", "fleetcap_semaphore_standby"} {
		if _, ok := sample(mfs, name, "key", "tenant:acme"); ok {
			t.Errorf("%s has a series of the rendered key tenant:acme: a label per tenant", name)
		}
	}

	rows, body := semaphoreRows(t, f)
	byKey := map[string]SemaphoreStatus{}
	for _, r := range rows {
		byKey[r.Key] = r
		for _, c := range r.Busiest {
			byKey[c.Key] = c
		}
	}
	for _, c := range []struct {
		key              string
		waiting, standby int
		atLeast          time.Duration
	}{
		{"legacy-api", 4, 1, legacy.OldestWait},
		{"geocoder", 0, 0, 0},
		{"tenant:{tenant_id}", 4, 2, max(acme.OldestWait, globex.OldestWait)},
		{"tenant:acme", 2, 1, acme.OldestWait},
		{"tenant:globex", 2, 1, globex.OldestWait},
	} {
		r, ok := byKey[c.key]
		switch {
		case !ok:
			t.Errorf("/api/semaphores has no row %s: %s", c.key, body)
		case r.Waiting != c.waiting || r.Standby != c.standby || r.OldestWaitSeconds < c.atLeast.Seconds() || (c.waiting == 0) != (r.OldestWaitSeconds == 0):
			t.Errorf("row %s: waiting %d, standby %d, oldest %vs; want %d, %d, at least %v", c.key, r.Waiting, r.Standby, r.OldestWaitSeconds, c.waiting, c.standby, c.atLeast)
		}
	}
	if r := byKey["paused-queue"]; r.Waiting != 1 || r.Aside != 1 {
		t.Errorf("row paused-queue: waiting %d, aside %d; want 1 (standing by), 1", r.Waiting, r.Aside)
	}
	for _, field := range []string{`"waiting":4`, `"standby":1`, `"oldest_wait_seconds":`, `"aside":1`} {
		if !strings.Contains(body, field) {
			t.Errorf("/api/semaphores lacks %s: %s", field, body)
		}
	}
}

// evalshaCalls is how many EVALSHA commands the server has run.
func evalshaCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	return redistest.CommandCalls(t, rdb)["evalsha"]
}

// TestRoomCollectorReadsOncePerInterval: however often Prometheus scrapes,
// the collector lists the keys once and reads each key's room once (one
// script call) per CacheFor; with Redis gone it reports
// fleetcap_semaphore_rooms_up 0 and no room series rather than stale ones.
func TestRoomCollectorReadsOncePerInterval(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	sem := newTestSemaphore(t, rdb)
	const tenants = 40
	keys := []KeyInfo{{Key: "tenant:{tenant_id}", Capacity: 1, Template: "tenant:{tenant_id}"}}
	for i := range tenants {
		keys = append(keys, KeyInfo{Key: "tenant:" + strconv.Itoa(i), Capacity: 1, Template: "tenant:{tenant_id}"})
	}
	var listed atomic.Int64
	list := func(context.Context) ([]KeyInfo, error) { listed.Add(1); return keys, nil }
	if _, err := sem.RoomStats(context.Background(), "warm-up"); err != nil { // loads the script
		t.Fatal(err)
	}

	c, err := NewRoomCollector(sem, list, RoomCollectorOptions{CacheFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	before := evalshaCalls(t, rdb)
	for range 5 {
		mfs := families(t, reg)
		if got := mustSample(t, mfs, "fleetcap_semaphore_tasks_waiting", "key", "tenant:{tenant_id}"); got != 0 {
			t.Fatalf("tasks waiting = %v, want 0", got)
		}
	}
	if n := listed.Load(); n != 1 {
		t.Errorf("5 scrapes within CacheFor listed the keys %d times, want 1", n)
	}
	if n := evalshaCalls(t, rdb) - before; n != tenants {
		t.Errorf("5 scrapes within CacheFor ran %d scripts, want %d (one per listed key)", n, tenants)
	}

	every, err := NewRoomCollector(sem, list, RoomCollectorOptions{CacheFor: -1, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	reg.MustRegister(every)
	listed.Store(0)
	families(t, reg)
	families(t, reg)
	if n := listed.Load(); n != 2 {
		t.Errorf("2 scrapes without a cache listed the keys %d times, want 2", n)
	}
	srv.Stop()
	mfs := families(t, reg)
	if got := mustSample(t, mfs, "fleetcap_semaphore_rooms_up"); got != 0 {
		t.Errorf("rooms_up with Redis stopped = %v, want 0", got)
	}
	if _, ok := mfs["fleetcap_semaphore_tasks_waiting"]; ok {
		t.Error("tasks waiting still exported with Redis stopped")
	}
	if _, err := NewRoomCollector(nil, list, RoomCollectorOptions{}); err == nil {
		t.Error("NewRoomCollector without a Service: no error")
	}
}

// TestFairValuesAndWeightedSeatsOnTheAPI: a key with fair_by lists the
// values with the most tasks waiting, on /api/semaphores and /metrics, and
// a holder of weight 2 counts 2 seats in used.
func TestFairValuesAndWeightedSeatsOnTheAPI(t *testing.T) {
	f := newFixture(t, fixtureOptions{keys: []KeyInfo{{Key: "hooks", Capacity: 3}}})
	ctx := context.Background()
	if p, err := f.sem.TryAcquire(ctx, "hooks", 3, semaphore.WithWeight(2), semaphore.WithHolder("heavy"), semaphore.WithTTL(10*time.Minute)); p == nil || err != nil {
		t.Fatalf("a seat of weight 2: (%v, %v)", p, err)
	}
	f.hold(t, "hooks", 3, 1, "light")
	for i, value := range []string{"acme", "acme", "acme", "globex", "acme", "globex", "initech"} {
		if _, err := f.sem.Park(ctx, "hooks", 3, fmt.Sprintf("default\x00t%d", i), testRoom, semaphore.WithShare(value, 1)); err != nil {
			t.Fatal(err)
		}
	}
	rows, body := semaphoreRows(t, f)
	if len(rows) != 1 {
		t.Fatalf("rows %s", body)
	}
	r := rows[0]
	want := []semaphore.ShareWaiting{{Value: "acme", Waiting: 4}, {Value: "globex", Waiting: 2}, {Value: "initech", Waiting: 1}}
	if r.Used != 3 || r.Waiting != 7 || !slices.Equal(r.FairValues, want) || r.OldestWaitSeconds <= 0 {
		t.Fatalf("row: used %d, waiting %d, fair values %v, oldest %vs; want 3, 7, %v, > 0", r.Used, r.Waiting, r.FairValues, r.OldestWaitSeconds, want)
	}
	if !strings.Contains(body, `"fair_values":[{"value":"acme","waiting":4}`) || !strings.Contains(body, `"seats":2`) {
		t.Errorf("/api/semaphores lacks the fair values or a holder's seats: %s", body)
	}
	mfs := scrape(t, f.http.URL+"/metrics")
	for value, want := range map[string]float64{"acme": 4, "globex": 2, "initech": 1} {
		if got := mustSample(t, mfs, "fleetcap_semaphore_fair_value_waiting", "key", "hooks", "value", value); got != want {
			t.Errorf("fleetcap_semaphore_fair_value_waiting{key=hooks,value=%s} = %v, want %v", value, got, want)
		}
	}
}

// semaphoreRows reads GET /api/semaphores: its rows, and its body for
// messages.
func semaphoreRows(t *testing.T, f *fixture) ([]SemaphoreStatus, string) {
	t.Helper()
	status, body := f.do(t, http.MethodGet, "/api/semaphores", "")
	if status != http.StatusOK {
		t.Fatalf("GET /api/semaphores: %d %s", status, body)
	}
	var rows []SemaphoreStatus
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Fatal(err)
	}
	return rows, body
}

// TestRateRoomsOnMetrics: the tasks waiting in the rate limits' rooms are
// exported as fleetcap_ratelimit_tasks_waiting, a plain key under its own
// label, the rendered keys of a template summed under the template's (no
// series a tenant), an idle key at 0.
func TestRateRoomsOnMetrics(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	sem := newTestSemaphore(t, rdb)
	lim, err := ratelimit.New(rdb, ratelimit.Options{Prefix: "test:sem:"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rooms := sem.PacedRooms(false)
	for key, n := range map[string]int{"slack": 2, "stripe:acct_1": 1, "stripe:acct_2": 2} {
		for i := range n {
			if _, err := rooms.Park(ctx, key, fmt.Sprintf("q\x00%s-%d", key, i), time.Minute, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	limit := ratelimit.Limit{Rate: 10, Per: time.Second, Burst: 10}
	rateKeys := []RateKeyInfo{
		{Key: "slack", Limit: limit}, {Key: "github", Limit: limit},
		{Key: "stripe:{account_id}", Template: "stripe:{account_id}", Limit: limit},
		{Key: "stripe:acct_1", Template: "stripe:{account_id}", Limit: limit},
		{Key: "stripe:acct_2", Template: "stripe:{account_id}", Limit: limit},
	}
	c, err := NewRoomCollector(sem, func(context.Context) ([]KeyInfo, error) { return nil, nil }, RoomCollectorOptions{CacheFor: -1,
		Limiter: lim, RateKeys: func(context.Context) ([]RateKeyInfo, error) { return rateKeys, nil }})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs := families(t, reg)
	for key, want := range map[string]float64{"slack": 2, "github": 0, "stripe:{account_id}": 3} {
		if got := mustSample(t, mfs, "fleetcap_ratelimit_tasks_waiting", "key", key); got != want {
			t.Errorf("fleetcap_ratelimit_tasks_waiting{key=%q} = %v, want %v", key, got, want)
		}
	}
	if _, ok := sample(mfs, "fleetcap_ratelimit_tasks_waiting", "key", "stripe:acct_1"); ok {
		t.Error("a series of the rendered key stripe:acct_1: a label per tenant")
	}
	if got := mustSample(t, mfs, "fleetcap_semaphore_rooms_up"); got != 1 {
		t.Errorf("fleetcap_semaphore_rooms_up = %v, want 1", got)
	}
}

// newTestSemaphore is a semaphore Service on rdb, closed with the test.
func newTestSemaphore(t *testing.T, rdb redis.UniversalClient) *semaphore.Service {
	t.Helper()
	sem, err := semaphore.New(rdb, semaphore.Options{Prefix: "test:sem:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	return sem
}
