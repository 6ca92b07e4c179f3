// Package ratelimit is a fleet-wide rate limiter on Redis: every process that
// shares the Redis takes tokens from one generic cell rate (GCRA) per key, on
// the Redis server's clock, so that workers with skewed clocks neither
// over-admit nor starve. The algorithm is github.com/go-redis/redis_rate's;
// this package adds Cluster-safe keys, a look that spends nothing (Peek),
// argument checks and an observer for metrics. The tasks that wait for a
// limit's tokens wait in a paced room of package semaphore, which package
// admission hands out at the limit's pace.
//
// Each limited key is one Redis string (its theoretical arrival time) that
// expires once the key has been idle long enough to be back at full burst.
package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/rediskey"
)

// DefaultPrefix starts every rate-limit key this package writes, after the
// "rate:" that redis_rate puts first: key "stripe" lives at
// "rate:fleetcap:sem:{stripe}". It is the prefix of every key of a fleet
// whose config sets no semaphore.prefix, so that a Limiter with the
// defaults takes from that fleet's limits.
const DefaultPrefix = rediskey.DefaultPrefix

// Limit is a rate: Rate tokens every Per, of which at most Burst may be taken
// at once (after an idle spell).
type Limit struct {
	Rate  int           // tokens per Per, >= 1
	Per   time.Duration // > 0
	Burst int           // >= 1
}

// Validate reports what is wrong with the limit, naming the field.
func (l Limit) Validate() error {
	switch {
	case l.Rate < 1:
		return fmt.Errorf("ratelimit: rate must be >= 1, got %d", l.Rate)
	case l.Per <= 0:
		return fmt.Errorf("ratelimit: per must be a duration > 0, got %s", l.Per)
	case l.Burst < 1:
		return fmt.Errorf("ratelimit: burst must be >= 1, got %d", l.Burst)
	case l.Interval() < MinInterval:
		return fmt.Errorf("ratelimit: rate %d per %s is more than one token every %s", l.Rate, l.Per, MinInterval)
	}
	return nil
}

// MinInterval is the shortest time between two tokens a Limit may ask for:
// the resolution of the Redis server's clock.
const MinInterval = time.Microsecond

// String returns the limit as "100 per 1s (burst 20)".
func (l Limit) String() string {
	return fmt.Sprintf("%d per %s (burst %d)", l.Rate, l.Per, l.Burst)
}

// Interval is the time one token takes to come back.
func (l Limit) Interval() time.Duration {
	return time.Duration(float64(l.Per) / float64(l.Rate))
}

// Result is the answer of Take or Peek.
type Result struct {
	// Allowed reports whether the tokens were taken (Take) or would be
	// taken now (Peek).
	Allowed bool
	// Remaining is how many tokens could be taken at once right after the
	// call: after the take when Take was allowed, else as they stand.
	Remaining int
	// RetryAfter is, when Allowed is false, how long until the tokens are
	// due by the Redis server's clock; 0 when Allowed.
	RetryAfter time.Duration
}

// ErrCostAboveBurst is returned by Take and Peek for a cost above the
// limit's burst: such a take could never be allowed.
var ErrCostAboveBurst = errors.New("ratelimit: cost above burst can never be allowed")

// Options configures New.
type Options struct {
	// Prefix starts every key, after redis_rate's own "rate:": a fleet's
	// semaphore.prefix; default DefaultPrefix. It must not contain "{" or
	// "}" (the keys' hash tag).
	Prefix string
	// Observer receives every Take; nil: none.
	Observer Observer
}

// TakeEvent describes one Take call that reached Redis.
type TakeEvent struct {
	Key        string
	Cost       int
	Allowed    bool
	Remaining  int
	RetryAfter time.Duration // when not allowed: the wait until the tokens are due
}

// Observer receives the limiter's events; monitoring turns them into
// metrics. Calls are made synchronously from the goroutine that called
// Take, so implementations must be fast and safe for concurrent use.
type Observer interface {
	// Take is called once per Take call that got an answer from Redis.
	Take(TakeEvent)
}

// Limiter takes tokens from fleet-wide rate limits. It is safe for
// concurrent use.
type Limiter struct {
	rdb    redis.UniversalClient
	gcra   *redis_rate.Limiter
	prefix string
	obs    Observer
}

// New returns a limiter on rdb (a client, a Cluster client or a failover
// client).
func New(rdb redis.UniversalClient, opts Options) (*Limiter, error) {
	if rdb == nil {
		return nil, errors.New("ratelimit: New: nil Redis client")
	}
	prefix, err := rediskey.PrefixOrDefault(opts.Prefix)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: New: Prefix %w", err)
	}
	return &Limiter{rdb: rdb, gcra: redis_rate.NewLimiter(rdb), prefix: prefix, obs: opts.Observer}, nil
}

// Take takes cost tokens of key now, or takes none and says in RetryAfter
// how long until they are due. Nothing is spent when it is not allowed.
func (l *Limiter) Take(ctx context.Context, key string, limit Limit, cost int) (Result, error) {
	if err := checkArgs(key, limit, cost); err != nil {
		return Result{}, err
	}
	r, err := l.gcra.AllowN(ctx, l.redisKey(key), limit.gcra(), cost)
	if err != nil {
		return Result{}, fmt.Errorf("ratelimit: take %q: %w", key, err)
	}
	res := Result{Allowed: r.Allowed > 0, Remaining: limit.remaining(r.ResetAfter)}
	if !res.Allowed {
		res.RetryAfter = ceilMicro(r.RetryAfter)
	}
	if l.obs != nil {
		l.obs.Take(TakeEvent{Key: key, Cost: cost, Allowed: res.Allowed, Remaining: res.Remaining, RetryAfter: res.RetryAfter})
	}
	return res, nil
}

// Peek says whether cost tokens of key could be taken now and, if not, how
// long until they are due, without spending any: a waiting task can sleep
// until its tokens are due and only then Take them. Remaining is the tokens
// available now.
func (l *Limiter) Peek(ctx context.Context, key string, limit Limit, cost int) (Result, error) {
	if err := checkArgs(key, limit, cost); err != nil {
		return Result{}, err
	}
	// A take of 0 tokens spends nothing, and its ResetAfter is how far the
	// key's theoretical arrival time (TAT) lies ahead of the server's now.
	// cost tokens are due when now reaches TAT + cost*interval -
	// burst*interval, the moment Take would be allowed.
	r, err := l.gcra.AllowN(ctx, l.redisKey(key), limit.gcra(), 0)
	if err != nil {
		return Result{}, fmt.Errorf("ratelimit: peek %q: %w", key, err)
	}
	ahead := max(0, r.ResetAfter)
	remaining := limit.remaining(ahead)
	wait := ahead + time.Duration(float64(cost-limit.Burst)*float64(limit.Interval()))
	if wait <= 0 {
		return Result{Allowed: true, Remaining: remaining}, nil
	}
	return Result{Remaining: remaining, RetryAfter: ceilMicro(wait)}, nil
}

//go:embed refund.lua
var refundSrc string

var refundScript = redis.NewScript(refundSrc)

// Refund gives back cost tokens that a Take of key spent for work that then
// did not run (a task whose other rate limit had no token), as if they had
// never been taken; a burst is never exceeded. It relies on how redis_rate
// keeps a key (refund.lua), which TestRefundUndoesATake pins.
func (l *Limiter) Refund(ctx context.Context, key string, limit Limit, cost int) error {
	if err := checkArgs(key, limit, cost); err != nil {
		return err
	}
	interval := limit.Per.Seconds() / float64(limit.Rate)
	if err := refundScript.Run(ctx, l.rdb, []string{l.RedisKey(key)}, interval, cost).Err(); err != nil {
		return fmt.Errorf("ratelimit: refund %q: %w", key, err)
	}
	return nil
}

// Reset forgets what was taken from key: it is back at full burst.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if key == "" {
		return errors.New("ratelimit: empty key")
	}
	if err := l.gcra.Reset(ctx, l.redisKey(key)); err != nil {
		return fmt.Errorf("ratelimit: reset %q: %w", key, err)
	}
	return nil
}

// RedisKey is the Redis key that holds key's state, as redis_rate writes
// it: "rate:" + prefix + "{" + key + "}", with "%" and "}" of key
// percent-encoded (rediskey.HashTag) so that the whole key is the hash tag
// on a Cluster.
func (l *Limiter) RedisKey(key string) string { return "rate:" + l.redisKey(key) }

// redisKey is RedisKey without redis_rate's "rate:".
func (l *Limiter) redisKey(key string) string {
	return l.prefix + "{" + rediskey.HashTag(key) + "}"
}

// remaining is how many tokens may be taken at once when the key's TAT lies
// ahead of the server's now by ahead (redis_rate's ResetAfter). redis_rate's
// own Remaining truncates a float that its epoch-sized arithmetic leaves a
// hair short (3.9999994 tokens for 4), so it is computed here from ahead,
// forgiving a thousandth of a token.
func (l Limit) remaining(ahead time.Duration) int {
	n := math.Floor(float64(l.Burst) - float64(max(0, ahead))/float64(l.Interval()) + 1e-3)
	return int(max(0, min(float64(l.Burst), n)))
}

func (l Limit) gcra() redis_rate.Limit {
	return redis_rate.Limit{Rate: l.Rate, Burst: l.Burst, Period: l.Per}
}

func checkArgs(key string, limit Limit, cost int) error {
	if key == "" {
		return errors.New("ratelimit: empty key")
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if cost < 1 {
		return fmt.Errorf("ratelimit: cost must be >= 1, got %d", cost)
	}
	if cost > limit.Burst {
		return fmt.Errorf("%w: cost %d, limit %s", ErrCostAboveBurst, cost, limit)
	}
	return nil
}

// ceilMicro rounds d up to a whole microsecond, the resolution of the
// server's clock, so that a caller who waits RetryAfter is not a fraction
// early.
func ceilMicro(d time.Duration) time.Duration {
	return time.Duration(math.Ceil(float64(d)/float64(time.Microsecond))) * time.Microsecond
}
