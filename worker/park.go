package worker

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/asynqx"
	"github.com/fleetcap/fleetcap/semaphore"
)

// parking wakes tasks that went back to asynq for want of a seat. Such a
// task is parked on its semaphore (semaphore.Service.Park) with its token,
// unless a seat is free by then (it tries again instead); a task parks once
// however often it goes back, and its token leaves when it takes a seat
// (semaphore.WithUnpark). Every release of a seat, by any worker, takes the
// first token; onWake moves that task to the dequeuing end of its queue at
// once (asynqx.Wake), so that it runs before tasks that came after it,
// instead of leaving it to asynq's forwarder, but only while the task still
// waits for that seat: a wake never runs a task that completed, failed,
// was archived or waits for another key meanwhile. The retry delay
// (parkDelay) is only the safety net, for seats that free without a
// release (an expired lease).
type parking struct {
	sem *semaphore.Service
	rdb redis.UniversalClient
	log *slog.Logger
}

// parkedTTL bounds how long the parked line of an idle key lives: past
// parkDelay every parked task came back by itself.
const parkedTTL = 3 * parkDelay

// parkToken is a task's token in the parked line of a key.
func parkToken(queue, taskID string) string { return queue + "\x00" + taskID }

// park parks a task on key; false when a seat is free now.
func (p *parking) park(ctx context.Context, key string, capacity int, queue, taskID string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return p.sem.Park(ctx, key, capacity, parkToken(queue, taskID), parkedTTL)
}

// onWake brings the task of a token back to its queue. When the task no
// longer waits for the seat it wakes the next one, so that the release is
// not wasted.
func (p *parking) onWake(key, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 16 {
		queue, id, ok := strings.Cut(token, "\x00")
		if ok && p.bringBack(ctx, key, queue, id) {
			return
		}
		next, err := p.sem.Unpark(ctx, key)
		if err != nil {
			p.log.Warn("worker: wake a parked task (it comes back by itself)", "key", key, "err", err)
			return
		}
		if next == "" {
			return
		}
		token = next
	}
}

// bringBack brings one parked task back; false when it does not wait for a
// seat of key any more.
func (p *parking) bringBack(ctx context.Context, key, queue, id string) bool {
	// A task parks just before its handler returns: give asynq a moment to
	// move it from active to retry.
	deadline := time.Now().Add(200 * time.Millisecond)
	for {
		res, err := asynqx.Wake(ctx, p.rdb, queue, id, requeueMark(key), copiedHeader)
		switch {
		case err != nil:
			p.log.Warn("worker: wake a parked task (it comes back by itself)", "queue", queue, "id", id, "err", err)
			return false
		case res == asynqx.Woken:
			return true
		case res == asynqx.Active && time.Now().Before(deadline):
			select {
			case <-ctx.Done():
				return false
			case <-time.After(time.Millisecond):
			}
		default:
			return false
		}
	}
}
