package worker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/semaphore"
)

// parking wakes tasks that went back to asynq for want of a seat. Such a
// task is parked on its semaphore (semaphore.Service.Park) with the token
// "queue\x00id", unless a seat is free by then (it tries again instead).
// Every release of a seat, by any worker, takes the first token; onWake
// moves that task from the retry set to its queue at once
// (Inspector.RunTask) instead of leaving it to asynq's forwarder. The
// retry delay (parkDelay) is only the safety net, for seats that free
// without a release (an expired lease, a force-release).
type parking struct {
	sem  *semaphore.Service
	insp *asynq.Inspector
	log  *slog.Logger
}

// parkedTTL bounds how long the parked line of an idle key lives: past
// parkDelay every parked task came back by itself.
const parkedTTL = 3 * parkDelay

// park parks a task on key; false when a seat is free now.
func (p *parking) park(ctx context.Context, key string, capacity int, queue, taskID string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return p.sem.Park(ctx, key, capacity, queue+"\x00"+taskID, parkedTTL)
}

// onWake brings the task of a token back to its queue. When the token is
// stale (its task came back by itself meanwhile) it wakes the next one, so
// that the release is not wasted.
func (p *parking) onWake(key, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 16 {
		queue, id, ok := strings.Cut(token, "\x00")
		if ok && p.run(ctx, queue, id) {
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

// run brings one parked task back; false when it was not parked any more.
func (p *parking) run(ctx context.Context, queue, id string) bool {
	// A task parks just before its handler returns: give asynq a moment to
	// move it from active to retry.
	deadline := time.Now().Add(200 * time.Millisecond)
	for {
		err := p.insp.RunTask(queue, id)
		switch {
		case err == nil:
			return true
		case strings.Contains(err.Error(), "already running") && time.Now().Before(deadline):
			select {
			case <-ctx.Done():
				return false
			case <-time.After(time.Millisecond):
			}
		case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound),
			strings.Contains(err.Error(), "pending"), strings.Contains(err.Error(), "already running"):
			return false
		default:
			p.log.Warn("worker: wake a parked task (it comes back by itself)", "queue", queue, "id", id, "err", err)
			return false
		}
	}
}
