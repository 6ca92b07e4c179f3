package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/ratelimit"
)

// At most 2 calls to the Stripe API a second across every process that
// shares the Redis: the third call in a row learns when its token is due.
func ExampleLimiter_Take() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	limiter, err := ratelimit.New(rdb, ratelimit.Options{})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	stripe := ratelimit.Limit{Rate: 2, Per: time.Second, Burst: 2}

	for range 3 {
		res, err := limiter.Take(ctx, "stripe:acct_42", stripe, 1)
		if err != nil {
			panic(err)
		}
		if res.Allowed {
			fmt.Println("call Stripe; tokens left:", res.Remaining)
		} else {
			fmt.Println("no token; due within half a second:", res.RetryAfter <= 500*time.Millisecond)
		}
	}
	// Output:
	// call Stripe; tokens left: 1
	// call Stripe; tokens left: 0
	// no token; due within half a second: true
}

// Peek tells a waiting task when its token is due without spending it, so
// the task can sleep until then and take the token only when it runs.
func ExampleLimiter_Peek() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	limiter, err := ratelimit.New(rdb, ratelimit.Options{})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	slack := ratelimit.Limit{Rate: 1, Per: time.Minute, Burst: 1}

	if _, err := limiter.Take(ctx, "slack:T123", slack, 1); err != nil {
		panic(err)
	}
	due, err := limiter.Peek(ctx, "slack:T123", slack, 1)
	if err != nil {
		panic(err)
	}
	again, err := limiter.Peek(ctx, "slack:T123", slack, 1)
	if err != nil {
		panic(err)
	}
	fmt.Println("allowed now:", due.Allowed)
	fmt.Println("due within a minute:", due.RetryAfter > 59*time.Second && due.RetryAfter <= time.Minute)
	fmt.Println("peeking spent nothing:", again.RetryAfter <= due.RetryAfter)
	// Output:
	// allowed now: false
	// due within a minute: true
	// peeking spent nothing: true
}
