package control_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/syncbuf"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/ratelimit"
)

func newStore(t *testing.T, rdb redis.UniversalClient) *control.Store {
	t.Helper()
	s, err := control.NewStore(rdb, control.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newReader(t *testing.T, s *control.Store, opts control.ReaderOptions) *control.Reader {
	t.Helper()
	r, err := control.NewReader(context.Background(), s, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

var stripe = ratelimit.Limit{Rate: 100, Per: time.Second, Burst: 20}

func TestSetLoadAndClear(t *testing.T) {
	s := newStore(t, redistest.Start(t).Client())
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.SetCapacity(ctx, "legacy-api", 3))
	must(s.SetCapacity(ctx, "tenant:{tenant_id}", 0))
	must(s.SetCapacity(ctx, "legacy-api", 4)) // the last write wins
	must(s.SetRate(ctx, "stripe:{account_id}", stripe))
	must(s.SetRate(ctx, "legacy-api", ratelimit.Limit{Rate: 1, Per: time.Minute, Burst: 1})) // another kind, same name

	o, err := s.Load(ctx)
	must(err)
	if len(o.Capacities) != 2 || o.Capacities["legacy-api"] != 4 || o.Capacities["tenant:{tenant_id}"] != 0 {
		t.Errorf("capacities = %v", o.Capacities)
	}
	if len(o.Rates) != 2 || o.Rates["stripe:{account_id}"] != stripe || o.Rates["legacy-api"].Per != time.Minute {
		t.Errorf("rates = %v", o.Rates)
	}

	for _, c := range []struct {
		name  string
		clear func() (bool, error)
		want  bool
	}{
		{"capacity set", func() (bool, error) { return s.ClearCapacity(ctx, "legacy-api") }, true},
		{"capacity cleared", func() (bool, error) { return s.ClearCapacity(ctx, "legacy-api") }, false},
		{"rate set", func() (bool, error) { return s.ClearRate(ctx, "stripe:{account_id}") }, true},
		{"rate never set", func() (bool, error) { return s.ClearRate(ctx, "nope") }, false},
	} {
		if got, err := c.clear(); err != nil || got != c.want {
			t.Errorf("clear %s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	o, err = s.Load(ctx)
	must(err)
	if len(o.Capacities) != 1 || len(o.Rates) != 1 || o.Rates["legacy-api"].Rate != 1 {
		t.Errorf("after the clears: %+v", o)
	}
}

func TestExactKeyWinsOverItsTemplate(t *testing.T) {
	s := newStore(t, redistest.Start(t).Client())
	ctx := context.Background()
	if err := s.SetCapacity(ctx, "tenant:{tenant_id}", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.SetCapacity(ctx, "tenant:acme", 7); err != nil {
		t.Fatal(err)
	}
	slow := ratelimit.Limit{Rate: 5, Per: time.Second, Burst: 5}
	if err := s.SetRate(ctx, "stripe:{account_id}", slow); err != nil {
		t.Fatal(err)
	}
	r := newReader(t, s, control.ReaderOptions{})
	for _, c := range []struct {
		key, template  string
		want           int
		wantOverridden bool
	}{
		{"tenant:acme", "tenant:{tenant_id}", 7, true},   // its own override
		{"tenant:globex", "tenant:{tenant_id}", 1, true}, // the template's
		{"tenant:{tenant_id}", "tenant:{tenant_id}", 1, true},
		{"tenant:globex", "", 2, false}, // as a plain key: no template to fall back on
		{"legacy-api", "", 2, false},
	} {
		if got, over := r.CapacityFor(c.key, c.template, 2); got != c.want || over != c.wantOverridden {
			t.Errorf("CapacityFor(%q, %q, 2) = %d, %v; want %d, %v", c.key, c.template, got, over, c.want, c.wantOverridden)
		}
	}
	if got, over := r.RateFor("stripe:acct_1", "stripe:{account_id}", stripe); got != slow || !over {
		t.Errorf("RateFor(stripe:acct_1) = %s, %v; want %s, true", got, over, slow)
	}
	if got, over := r.RateFor("slack", "", stripe); got != stripe || over {
		t.Errorf("RateFor(slack) = %s, %v; want the configured %s", got, over, stripe)
	}
}

// TestAnotherReaderSeesAChangeWithinASecond writes through one store and
// watches a reader on another connection (another worker) pick it up by
// itself, for a set and for a clear.
func TestAnotherReaderSeesAChangeWithinASecond(t *testing.T) {
	srv := redistest.Start(t)
	writer := newStore(t, srv.Client())
	other := newReader(t, newStore(t, srv.Client()), control.ReaderOptions{})
	ctx := context.Background()

	if err := writer.SetCapacity(ctx, "legacy-api", 0); err != nil {
		t.Fatal(err)
	}
	took := waitfor.Condition(t, time.Second, "the other reader sees the pause", func() bool {
		n, over := other.CapacityFor("legacy-api", "", 5)
		return n == 0 && over
	})
	t.Logf("pause seen after %s", took)
	if _, err := writer.ClearCapacity(ctx, "legacy-api"); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, time.Second, "the other reader sees the clear", func() bool {
		n, over := other.CapacityFor("legacy-api", "", 5)
		return n == 5 && !over
	})
	if err := writer.SetRate(ctx, "stripe", stripe); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, time.Second, "the other reader sees the rate", func() bool {
		_, over := other.RateFor("stripe", "", ratelimit.Limit{Rate: 1, Per: time.Second, Burst: 1})
		return over
	})
}

// TestOverridesOutliveTheirWorker: a reader made later, on a new
// connection (a restarted worker), finds what was set before.
func TestOverridesOutliveTheirWorker(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	first := newStore(t, srv.Client())
	if err := first.SetCapacity(ctx, "legacy-api", 1); err != nil {
		t.Fatal(err)
	}
	if err := first.SetRate(ctx, "stripe", stripe); err != nil {
		t.Fatal(err)
	}
	r := newReader(t, newStore(t, srv.Client()), control.ReaderOptions{})
	if n, over := r.CapacityFor("legacy-api", "", 5); n != 1 || !over {
		t.Errorf("a new reader: capacity %d, %v; want 1, true", n, over)
	}
	if l, over := r.RateFor("stripe", "", ratelimit.Limit{Rate: 1, Per: time.Hour, Burst: 1}); l != stripe || !over {
		t.Errorf("a new reader: rate %s, %v; want %s", l, over, stripe)
	}
	if ttl := srv.Client().TTL(ctx, first.Key()).Val(); ttl != -1 {
		t.Errorf("TTL of the overrides = %s, want none (-1)", ttl)
	}
}

func TestBadOverridesAreRefused(t *testing.T) {
	s := newStore(t, redistest.Start(t).Client())
	ctx := context.Background()
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"negative capacity", s.SetCapacity(ctx, "k", -1), "capacity must be >= 0"},
		{"empty key", s.SetCapacity(ctx, "", 1), "empty key"},
		{"long key", s.SetCapacity(ctx, strings.Repeat("k", control.MaxKeyLen+1), 1), "longer than the 1024 allowed"},
		{"rate 0", s.SetRate(ctx, "k", ratelimit.Limit{Per: time.Second, Burst: 1}), "rate must be >= 1"},
		{"per 0", s.SetRate(ctx, "k", ratelimit.Limit{Rate: 1, Burst: 1}), "per must be a duration > 0"},
		{"burst 0", s.SetRate(ctx, "k", ratelimit.Limit{Rate: 1, Per: time.Second}), "burst must be >= 1"},
		{"clear of an empty key", func() error { _, err := s.ClearRate(ctx, ""); return err }(), "empty key"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one saying %q", c.name, c.err, c.want)
		}
	}
	if o, err := s.Load(ctx); err != nil || len(o.Capacities)+len(o.Rates) != 0 {
		t.Errorf("after refused writes: %+v, %v; want nothing stored", o, err)
	}
	if _, err := control.NewStore(nil, control.Options{}); err == nil {
		t.Error("NewStore(nil): no error")
	}
	if _, err := control.NewReader(ctx, nil, control.ReaderOptions{}); err == nil {
		t.Error("NewReader(nil): no error")
	}
}

// TestUnreadableOverridesAreLoud writes junk into the hash by hand: Load
// names the field, and a reader keeps its last good reading, says why in
// Err and the log, and recovers when the junk is gone.
func TestUnreadableOverridesAreLoud(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	s := newStore(t, rdb)
	ctx := context.Background()
	if err := s.SetCapacity(ctx, "legacy-api", 1); err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	r := newReader(t, s, control.ReaderOptions{Interval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	for field, value := range map[string]string{
		"capacity:a": "lots", "capacity:b": "-1", "rate:c": "{", "rate:d": `{"rate":1,"per":"soon","burst":1}`,
		"rate:e": `{"rate":0,"per":"1s","burst":1}`, "limit:f": "1",
	} {
		rdb.HSet(ctx, s.Key(), field, value)
		_, err := s.Load(ctx)
		if err == nil || !strings.Contains(err.Error(), `field "`+field+`"`) {
			t.Errorf("Load with %s=%s: err = %v, want one naming the field", field, value, err)
		}
		rdb.HDel(ctx, s.Key(), field)
	}

	rdb.HSet(ctx, s.Key(), "capacity:legacy-api", "2", "capacity:junk", "x")
	waitfor.Condition(t, 2*time.Second, "the reader reports the junk", func() bool { return r.Err() != nil })
	if n, _ := r.CapacityFor("legacy-api", "", 5); n != 1 {
		t.Errorf("capacity while unreadable = %d, want the last good reading, 1", n)
	}
	rdb.HDel(ctx, s.Key(), "capacity:junk")
	waitfor.Condition(t, 2*time.Second, "the reader recovers", func() bool {
		n, _ := r.CapacityFor("legacy-api", "", 5)
		return r.Err() == nil && n == 2
	})
	out := logs.String()
	if strings.Count(out, "cannot read the overrides") != 1 || !strings.Contains(out, "overrides readable again") {
		t.Errorf("log should say once that the overrides are unreadable, then that they are back:\n%s", out)
	}
}

func TestNewReaderFailsWithoutRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	srv.Stop()
	if _, err := control.NewReader(context.Background(), newStore(t, rdb), control.ReaderOptions{}); err == nil {
		t.Fatal("NewReader with Redis down: no error")
	}
}

func TestOverridesOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	cl := redistest.StartCluster(t, 3).Client(t)
	s := newStore(t, cl)
	ctx := context.Background()
	if err := s.SetCapacity(ctx, "a{b}c", 2); err != nil {
		t.Fatal(err)
	}
	r := newReader(t, s, control.ReaderOptions{})
	if n, over := r.CapacityFor("a{b}c", "", 9); n != 2 || !over {
		t.Fatalf("CapacityFor on a cluster = %d, %v", n, over)
	}
}
