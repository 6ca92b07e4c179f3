package semaphore

import (
	"context"
	"fmt"
	"time"
)

// Parking: waiting outside the process. A scheduler that sends work back
// to a queue while the semaphore is full (the worker's requeue mode) parks
// a token per waiting task; every release of a seat by a Service with
// Options.OnWake hands the first token to that callback, in the same
// script call as the release, so that the task can be brought back at once.

// Park records token as waiting for a seat of key (a semaphore of permits
// seats) outside this Service, such as a task that went back to its queue,
// unless a seat is free for a newcomer now: then it returns false and the
// caller should try to take the seat instead. Each later release of a seat
// of key by a Service with Options.OnWake (on the same Redis and prefix)
// takes the first parked token and hands it to that OnWake; Services
// without one leave the tokens alone. Tokens are served in the order they
// first parked: parking a token again keeps its place, and it leaves the
// line when a release hands it out or when its owner takes a seat with
// WithUnpark. The parked line lapses ttl after the last Park.
func (s *Service) Park(ctx context.Context, key string, permits int, token string, ttl time.Duration) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	if err := checkPermits(permits); err != nil {
		return false, err
	}
	if token == "" || ttl <= 0 {
		return false, fmt.Errorf("semaphore: Park: want a token and a ttl > 0, got %q and %s", token, ttl)
	}
	k := s.keysFor(key)
	n, err := parkScript.Run(ctx, s.rdb, []string{k.holders, k.queue, k.parked}, permits, token, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("semaphore: park on %q: %w", key, err)
	}
	return n == 1, nil
}

// Unpark takes the first token parked on key, if any ("" when none): for
// an OnWake that found its token stale and wakes the next instead.
func (s *Service) Unpark(ctx context.Context, key string) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	first, err := s.rdb.ZPopMin(ctx, s.keysFor(key).parked).Result()
	if err != nil {
		return "", fmt.Errorf("semaphore: unpark on %q: %w", key, err)
	}
	if len(first) == 0 {
		return "", nil
	}
	token, _ := first[0].Member.(string)
	return token, nil
}

// wakeFlag tells the release scripts whether to take a parked token: only
// a Service with OnWake does, so that others leave the tokens alone.
func (s *Service) wakeFlag() string {
	if s.onWake != nil {
		return "1"
	}
	return "0"
}

// woke hands a token taken by a release to Options.OnWake.
func (s *Service) woke(key, token string) {
	if token != "" && s.onWake != nil {
		go s.onWake(key, token)
	}
}
