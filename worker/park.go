package worker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// parking keeps, per semaphore key, the line of tasks that went back to
// asynq for want of a seat, so that a release can wake one at once
// (Inspector.RunTask moves it from retry to pending) instead of leaving it to
// asynq's forwarder. The list shares the semaphore's hash tag.
type parking struct {
	rdb    redis.UniversalClient
	insp   *asynq.Inspector
	prefix string
	log    *slog.Logger
}

func (p *parking) listKey(key string) string { return p.prefix + "{" + key + "}:parked" }

// park puts a task at the end of key's parked line.
func (p *parking) park(ctx context.Context, key, queue, taskID string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	list := p.listKey(key)
	_, err := p.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.RPush(ctx, list, queue+"\x00"+taskID)
		pipe.PExpire(ctx, list, 3*parkDelay)
		return nil
	})
	return err
}

// wake moves the first task still parked on key back to its queue. Entries
// whose task is gone or already pending (brought back by the safety-net
// delay) are skipped; a task still finishing its handler is waited for
// briefly.
func (p *parking) wake(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 16 {
		entry, err := p.rdb.LPop(ctx, p.listKey(key)).Result()
		if errors.Is(err, redis.Nil) {
			return
		}
		if err != nil {
			p.log.Warn("worker: wake a parked task (it comes back by itself)", "key", key, "err", err)
			return
		}
		queue, id, ok := strings.Cut(entry, "\x00")
		if !ok {
			continue
		}
		if p.run(ctx, queue, id) {
			return
		}
	}
}

// run brings one parked task back; false when it was not parked any more.
func (p *parking) run(ctx context.Context, queue, id string) bool {
	for {
		err := p.insp.RunTask(queue, id)
		switch {
		case err == nil:
			return true
		case strings.Contains(err.Error(), "already running"):
			// Its handler is returning right now; asynq moves it to the
			// retry set within moments.
			select {
			case <-ctx.Done():
				return false
			case <-time.After(time.Millisecond):
			}
		case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound),
			strings.Contains(err.Error(), "pending"):
			return false
		default:
			p.log.Warn("worker: wake a parked task (it comes back by itself)", "queue", queue, "id", id, "err", err)
			return false
		}
	}
}
