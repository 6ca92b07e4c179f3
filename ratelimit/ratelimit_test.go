package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/rediskey"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/ratelimit"
)

func newLimiter(t *testing.T, rdb redis.UniversalClient, obs ratelimit.Observer) *ratelimit.Limiter {
	t.Helper()
	l, err := ratelimit.New(rdb, ratelimit.Options{Prefix: "test:", Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func take(t *testing.T, l *ratelimit.Limiter, key string, limit ratelimit.Limit, cost int) ratelimit.Result {
	t.Helper()
	res, err := l.Take(context.Background(), key, limit, cost)
	if err != nil {
		t.Fatalf("Take(%q, %s, %d): %v", key, limit, cost, err)
	}
	return res
}

func peek(t *testing.T, l *ratelimit.Limiter, key string, limit ratelimit.Limit, cost int) ratelimit.Result {
	t.Helper()
	res, err := l.Peek(context.Background(), key, limit, cost)
	if err != nil {
		t.Fatalf("Peek(%q, %s, %d): %v", key, limit, cost, err)
	}
	return res
}

func TestTakeSpendsTheBurstThenSaysWhenTheNextTokenIsDue(t *testing.T) {
	l := newLimiter(t, redistest.Start(t).Client(), nil)
	limit := ratelimit.Limit{Rate: 10, Per: time.Second, Burst: 5}
	for want := 4; want >= 0; want-- {
		res := take(t, l, "api", limit, 1)
		if !res.Allowed || res.Remaining != want || res.RetryAfter != 0 {
			t.Fatalf("take with %d left: %+v, want allowed with %d remaining", want+1, res, want)
		}
	}
	res := take(t, l, "api", limit, 1)
	if res.Allowed || res.Remaining != 0 {
		t.Fatalf("take of an empty burst: %+v, want not allowed", res)
	}
	// One token comes back every 100 ms; a little of that has passed.
	if res.RetryAfter <= 0 || res.RetryAfter > 100*time.Millisecond {
		t.Fatalf("RetryAfter = %s, want in (0, 100ms]", res.RetryAfter)
	}
	// A cost of 3 waits for three tokens.
	if res := take(t, l, "api", limit, 3); res.Allowed || res.RetryAfter <= 200*time.Millisecond || res.RetryAfter > 300*time.Millisecond {
		t.Fatalf("take of 3 tokens from an empty burst: %+v, want RetryAfter in (200ms, 300ms]", res)
	}
}

func TestPeekSpendsNothingAndTheTokenIsThereWhenItSaysSo(t *testing.T) {
	l := newLimiter(t, redistest.Start(t).Client(), nil)
	limit := ratelimit.Limit{Rate: 5, Per: time.Second, Burst: 2}

	for range 10 {
		if res := peek(t, l, "k", limit, 2); !res.Allowed || res.Remaining != 2 {
			t.Fatalf("peek of a fresh key: %+v, want allowed with 2 remaining", res)
		}
	}
	take(t, l, "k", limit, 2)
	p := peek(t, l, "k", limit, 1)
	if p.Allowed || p.RetryAfter <= 0 || p.RetryAfter > 200*time.Millisecond {
		t.Fatalf("peek after the burst: %+v, want not allowed, due in (0, 200ms]", p)
	}
	for range 10 {
		if again := peek(t, l, "k", limit, 1); again.Allowed || again.RetryAfter > p.RetryAfter {
			t.Fatalf("a later peek: %+v, want not allowed and due no later than %s", again, p.RetryAfter)
		}
	}
	// The time Peek gave is when Take succeeds: sleep exactly that long.
	time.Sleep(p.RetryAfter)
	if res := take(t, l, "k", limit, 1); !res.Allowed {
		t.Fatalf("take once the peeked wait has passed: %+v, want allowed", res)
	}
}

// TestPeekIsExactOnTheServerClock steers the server's clock (miniredis):
// Peek's RetryAfter is the very microsecond at which Take turns allowed,
// for one token and for several.
func TestPeekIsExactOnTheServerClock(t *testing.T) {
	mr := miniredis.RunT(t)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	mr.SetTime(now)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	l := newLimiter(t, rdb, nil)
	limit := ratelimit.Limit{Rate: 4, Per: time.Second, Burst: 4} // a token every 250 ms

	take(t, l, "k", limit, 4)
	for _, tc := range []struct {
		cost int
		due  time.Duration
	}{{1, 250 * time.Millisecond}, {3, 750 * time.Millisecond}} {
		p := peek(t, l, "k", limit, tc.cost)
		if p.Allowed || p.RetryAfter != tc.due {
			t.Fatalf("peek of %d after the burst: %+v, want due in %s", tc.cost, p, tc.due)
		}
		mr.SetTime(now.Add(p.RetryAfter - time.Millisecond))
		if res := take(t, l, "k", limit, tc.cost); res.Allowed {
			t.Fatalf("take of %d 1 ms before it is due: allowed", tc.cost)
		}
		mr.SetTime(now.Add(p.RetryAfter))
		if res := take(t, l, "k", limit, tc.cost); !res.Allowed {
			t.Fatalf("take of %d when it is due: %+v, want allowed", tc.cost, res)
		}
		now = now.Add(p.RetryAfter)
	}
}

// TestNoWindowSeesMoreThanRatePlusBurst takes tokens as fast as it can on
// a steered clock that moves on in small uneven steps, and counts the takes
// of every window of one period: never more than rate + burst, and over the
// whole run the rate itself.
func TestNoWindowSeesMoreThanRatePlusBurst(t *testing.T) {
	mr := miniredis.RunT(t)
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	l := newLimiter(t, rdb, nil)
	limit := ratelimit.Limit{Rate: 50, Per: time.Second, Burst: 10}

	var allowed []time.Duration // since start
	const run = 4 * time.Second
	for at, step := time.Duration(0), 0; at < run; step++ {
		mr.SetTime(start.Add(at))
		for take(t, l, "k", limit, 1).Allowed {
			allowed = append(allowed, at)
		}
		at += time.Duration(1+step%7) * time.Millisecond
	}
	j := 0
	for i := range allowed {
		for allowed[i]-allowed[j] >= limit.Per {
			j++
		}
		if n := i - j + 1; n > limit.Rate+limit.Burst {
			t.Fatalf("%d takes within %s ending at %s, want at most rate+burst = %d", n, limit.Per, allowed[i], limit.Rate+limit.Burst)
		}
	}
	if want := limit.Burst + int(run/time.Second)*limit.Rate; len(allowed) < want-1 || len(allowed) > want {
		t.Fatalf("%d takes in %s, want %d (burst + rate x seconds)", len(allowed), run, want)
	}
}

// TestRateHoldsAcrossClients runs several clients (as worker processes
// would) against one real Redis, on two keys at once: each key lets
// through its burst plus its rate over the run, no more, and not less than
// 90% of it, whatever the other key does.
func TestRateHoldsAcrossClients(t *testing.T) {
	srv := redistest.Start(t)
	limit := ratelimit.Limit{Rate: 100, Per: time.Second, Burst: 10}
	keys := []string{"tenant:acme", "tenant:globex"}
	var counts [2]atomic.Int64
	const run = 1500 * time.Millisecond

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	begin := time.Now()
	for c := range 4 {
		l := newLimiter(t, srv.Client(), nil)
		for g := range 2 {
			wg.Go(func() {
				k := (c + g) % 2
				for time.Since(begin) < run {
					res, err := l.Take(context.Background(), keys[k], limit, 1)
					if err != nil {
						errs <- err
						return
					}
					if res.Allowed {
						counts[k].Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(begin)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k, key := range keys {
		n := counts[k].Load()
		most := int64(limit.Burst) + int64(elapsed.Seconds()*float64(limit.Rate)) + 1
		least := int64(0.9 * run.Seconds() * float64(limit.Rate))
		if n > most || n < least {
			t.Errorf("%s: %d takes in %s, want %d..%d", key, n, elapsed, least, most)
		}
	}
}

func TestObserverSeesAllowedAndLimitedTakes(t *testing.T) {
	var obs recorder
	l := newLimiter(t, redistest.Start(t).Client(), &obs)
	limit := ratelimit.Limit{Rate: 1, Per: time.Minute, Burst: 1}
	take(t, l, "k", limit, 1)
	take(t, l, "k", limit, 1)
	peek(t, l, "k", limit, 1) // a peek is no take
	got := obs.all()
	if len(got) != 2 {
		t.Fatalf("events: %+v, want 2", got)
	}
	if e := got[0]; e.Key != "k" || e.Cost != 1 || !e.Allowed || e.RetryAfter != 0 {
		t.Errorf("first event %+v, want an allowed take of k", e)
	}
	if e := got[1]; e.Allowed || e.RetryAfter < 59*time.Second || e.RetryAfter > time.Minute {
		t.Errorf("second event %+v, want a limited take due in about a minute", e)
	}
}

type recorder struct {
	mu     sync.Mutex
	events []ratelimit.TakeEvent
}

func (r *recorder) Take(e ratelimit.TakeEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) all() []ratelimit.TakeEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ratelimit.TakeEvent(nil), r.events...)
}

func TestIdleKeysExpire(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	l := newLimiter(t, rdb, nil)
	limit := ratelimit.Limit{Rate: 20, Per: time.Second, Burst: 20}
	take(t, l, "short", limit, 3) // back at full burst 150 ms later
	ttl := rdb.PTTL(context.Background(), l.RedisKey("short")).Val()
	if ttl <= 0 || ttl > time.Second {
		t.Fatalf("PTTL of a key 150 ms from full burst = %s, want in (0, 1s]", ttl)
	}
	waitfor.Condition(t, 3*time.Second, "the idle key expires", func() bool {
		return rdb.Exists(context.Background(), l.RedisKey("short")).Val() == 0
	})
	if n := rdb.DBSize(context.Background()).Val(); n != 0 {
		t.Fatalf("%d keys left after the only limited key went idle, want 0", n)
	}
}

// TestKeysWithBracesOnACluster takes tokens on a 3-node Redis Cluster for
// keys holding braces and percent signs: each key has state of its own (the
// escaping is one-to-one) in the slot of its hash tag, rediskey.HashTag of
// the whole key.
func TestKeysWithBracesOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	cl := redistest.StartCluster(t, 3).Client(t)
	l := newLimiter(t, cl, nil)
	limit := ratelimit.Limit{Rate: 1, Per: time.Minute, Burst: 1}
	keys := []string{"plain", "tenant:{acme}", "{", "}", "}{", "%7B", "%", "a{b}c{d}", "päth/ü"}
	ctx := context.Background()
	for _, k := range keys {
		if res := take(t, l, k, limit, 1); !res.Allowed {
			t.Fatalf("first take of %q: %+v, want allowed (its state is shared with another key)", k, res)
		}
	}
	for _, k := range keys {
		if res := take(t, l, k, limit, 1); res.Allowed {
			t.Fatalf("second take of %q: allowed, want limited", k)
		}
		rk, tag := l.RedisKey(k), rediskey.HashTag(k)
		if rk != "rate:test:{"+tag+"}" {
			t.Fatalf("Redis key of %q = %q, want its hash tag %q", k, rk, tag)
		}
		want := cl.ClusterKeySlot(ctx, tag).Val()
		if got := cl.ClusterKeySlot(ctx, rk).Val(); got != want {
			t.Fatalf("slot of %q = %d, want that of its tag, %d", rk, got, want)
		}
		if cl.Exists(ctx, rk).Val() != 1 {
			t.Fatalf("Redis key %q of %q is missing", rk, k)
		}
	}
}

func TestBadArguments(t *testing.T) {
	l := newLimiter(t, redistest.Start(t).Client(), nil)
	ok := ratelimit.Limit{Rate: 10, Per: time.Second, Burst: 5}
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		key   string
		limit ratelimit.Limit
		cost  int
		want  string
	}{
		{"empty key", "", ok, 1, "empty key"},
		{"rate 0", "k", ratelimit.Limit{Rate: 0, Per: time.Second, Burst: 1}, 1, "rate must be >= 1"},
		{"negative rate", "k", ratelimit.Limit{Rate: -1, Per: time.Second, Burst: 1}, 1, "rate must be >= 1"},
		{"per 0", "k", ratelimit.Limit{Rate: 1, Burst: 1}, 1, "per must be a duration > 0"},
		{"negative per", "k", ratelimit.Limit{Rate: 1, Per: -time.Second, Burst: 1}, 1, "per must be a duration > 0"},
		{"burst 0", "k", ratelimit.Limit{Rate: 1, Per: time.Second}, 1, "burst must be >= 1"},
		{"rate finer than the clock", "k", ratelimit.Limit{Rate: 2000, Per: time.Millisecond, Burst: 1}, 1, "more than one token every 1µs"},
		{"cost 0", "k", ok, 0, "cost must be >= 1"},
		{"cost above burst", "k", ok, 6, "cost above burst"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for name, call := range map[string]func() (ratelimit.Result, error){
				"Take": func() (ratelimit.Result, error) { return l.Take(ctx, tc.key, tc.limit, tc.cost) },
				"Peek": func() (ratelimit.Result, error) { return l.Peek(ctx, tc.key, tc.limit, tc.cost) },
			} {
				if _, err := call(); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: err = %v, want one saying %q", name, err, tc.want)
				}
			}
		})
	}
	if _, err := l.Take(ctx, "k", ok, 6); !errors.Is(err, ratelimit.ErrCostAboveBurst) {
		t.Errorf("cost above burst: err = %v, want ErrCostAboveBurst", err)
	}
	if _, err := ratelimit.New(redistest.Start(t).Client(), ratelimit.Options{Prefix: "a{b}:"}); err == nil {
		t.Error("New with a prefix holding braces: no error")
	}
	if _, err := ratelimit.New(nil, ratelimit.Options{}); err == nil {
		t.Error("New with a nil client: no error")
	}
}

func TestRedisDownIsAnError(t *testing.T) {
	srv := redistest.Start(t)
	l := newLimiter(t, redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1}), nil)
	srv.Stop()
	limit := ratelimit.Limit{Rate: 1, Per: time.Second, Burst: 1}
	for name, call := range map[string]func() (ratelimit.Result, error){
		"Take": func() (ratelimit.Result, error) { return l.Take(context.Background(), "k", limit, 1) },
		"Peek": func() (ratelimit.Result, error) { return l.Peek(context.Background(), "k", limit, 1) },
	} {
		if res, err := call(); err == nil || !strings.Contains(err.Error(), `"k"`) {
			t.Errorf("%s with Redis down: %+v, %v; want an error naming the key", name, res, err)
		}
	}
	if err := l.Reset(context.Background(), "k"); err == nil {
		t.Error("Reset with Redis down: no error")
	}
}

func TestResetRestoresTheBurst(t *testing.T) {
	l := newLimiter(t, redistest.Start(t).Client(), nil)
	limit := ratelimit.Limit{Rate: 1, Per: time.Hour, Burst: 2}
	take(t, l, "k", limit, 2)
	if err := l.Reset(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	if res := take(t, l, "k", limit, 2); !res.Allowed {
		t.Fatalf("take of the whole burst after Reset: %+v", res)
	}
}

// TestRefundUndoesATake: tokens given back are there again, exactly, and a
// refund never makes more than the burst.
func TestRefundUndoesATake(t *testing.T) {
	srv := redistest.Start(t)
	l := newLimiter(t, srv.Client(), nil)
	ctx := context.Background()
	limit := ratelimit.Limit{Rate: 1, Per: time.Hour, Burst: 5}
	take(t, l, "k", limit, 3)
	if err := l.Refund(ctx, "k", limit, 2); err != nil {
		t.Fatal(err)
	}
	if res := peek(t, l, "k", limit, 1); res.Remaining != 4 {
		t.Fatalf("after taking 3 of 5 and giving 2 back: %d remaining, want 4", res.Remaining)
	}
	if err := l.Refund(ctx, "k", limit, 3); err != nil {
		t.Fatal(err)
	}
	if res := peek(t, l, "k", limit, 1); res.Remaining != 5 {
		t.Fatalf("after giving back more than was taken: %d remaining, want the burst, 5", res.Remaining)
	}
	if n, err := srv.Client().Exists(ctx, l.RedisKey("k")).Result(); err != nil || n != 0 {
		t.Fatalf("a key back at full burst is kept (%d, %v); want it gone, as an idle key", n, err)
	}
	if err := l.Refund(ctx, "k", limit, 0); err == nil {
		t.Fatal("a refund of 0 tokens: no error")
	}
}

func ExampleLimit_String() {
	fmt.Println(ratelimit.Limit{Rate: 100, Per: time.Second, Burst: 20})
	// Output: 100 per 1s (burst 20)
}
