package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waiting for tokens outside any process. A scheduler whose tasks wait in a
// queue rather than in a goroutine (the worker) parks a token per task that
// found no tokens, and asks NextDue, when the first is due, which task to
// bring back: one token a time, in arrival order, fleet-wide (however many
// processes ask, NextDue hands out at most one token per interval the
// limit earns cost tokens in).

//go:embed room.lua
var roomSrc string

var roomScript = redis.NewScript(roomSrc)

// Park puts token in key's room, keeping its place if it is there already.
// The room lapses ttl after its last Park.
func (l *Limiter) Park(ctx context.Context, key, token string, ttl time.Duration) error {
	if key == "" || token == "" || ttl < time.Millisecond {
		return fmt.Errorf("ratelimit: Park wants a key, a token and a ttl of at least 1ms, got %q, %q, %s", key, token, ttl)
	}
	room, next := l.roomKeys(key)
	if err := roomScript.Run(ctx, l.rdb, []string{room, next}, "park", token, ttl.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("ratelimit: park on %q: %w", key, err)
	}
	return nil
}

// ErrRoomEmpty is returned by NextDue when no token waits in the room.
var ErrRoomEmpty = errors.New("ratelimit: nobody waits")

// NextDue hands out the first token of key's room once cost tokens of the
// limit are due, or says how long until it may: then token is "". It
// returns ErrRoomEmpty when no token waits.
func (l *Limiter) NextDue(ctx context.Context, key string, limit Limit, cost int) (token string, wait time.Duration, err error) {
	room, next := l.roomKeys(key)
	peek, err := l.Peek(ctx, key, limit, cost)
	if err != nil {
		return "", 0, err
	}
	if !peek.Allowed {
		n, err := l.rdb.Exists(ctx, room).Result()
		switch {
		case err != nil:
			return "", 0, fmt.Errorf("ratelimit: room of %q: %w", key, err)
		case n == 0:
			return "", 0, ErrRoomEmpty
		}
		return "", peek.RetryAfter, nil
	}
	vals, err := roomScript.Run(ctx, l.rdb, []string{room, next}, "pop", time.Duration(float64(cost)*float64(limit.interval())).Microseconds()).Slice()
	if err != nil {
		return "", 0, fmt.Errorf("ratelimit: room of %q: %w", key, err)
	}
	if len(vals) != 2 {
		return "", 0, fmt.Errorf("ratelimit: room script replied %d values", len(vals))
	}
	token, _ = vals[0].(string)
	waitUs, _ := vals[1].(int64)
	if token == "" && waitUs < 0 {
		return "", 0, ErrRoomEmpty
	}
	return token, time.Duration(waitUs) * time.Microsecond, nil
}

// roomKeys are key's room (a ZSET of tokens by arrival) and the stamp of
// the next hand-out, in the hash tag of key's limit.
func (l *Limiter) roomKeys(key string) (room, next string) {
	base := "rate:" + l.redisKey(key)
	return base + ":room", base + ":next"
}
