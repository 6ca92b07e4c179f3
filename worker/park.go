package worker

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
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
	entry := queue + "\x00" + taskID + "\x00" + strconv.FormatInt(time.Now().UnixMilli(), 10)
	_, err := p.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.RPush(ctx, list, entry)
		pipe.PExpire(ctx, list, parkedListTTL)
		return nil
	})
	return err
}

// parkedListTTL is how long a parked line outlives its last park. Its
// entries are of no use after parkDelay (their tasks are back by then), so an
// idle key's line is gone soon after.
const parkedListTTL = parkDelay + 5*time.Second

// Waiting for a just-parked task to leave its handler. park runs right
// before the handler returns, so asynq moves the task to its retry set within
// moments; an entry older than parkedFresh whose task is running is stale
// (the task came back by its delay and runs again) and is skipped at once.
const (
	parkedFresh    = 2 * time.Second
	returningFor   = 250 * time.Millisecond
	returningFirst = time.Millisecond
	returningMax   = 20 * time.Millisecond
)

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
		queue, rest, ok := strings.Cut(entry, "\x00")
		if !ok {
			continue
		}
		id, at, _ := strings.Cut(rest, "\x00")
		fresh := true
		if ms, err := strconv.ParseInt(at, 10, 64); err == nil {
			fresh = time.Since(time.UnixMilli(ms)) < parkedFresh
		}
		if p.run(ctx, queue, id, fresh) {
			return
		}
	}
}

// run brings one parked task back; false when it was not parked any more.
// A task found running is waited for (with backoff, briefly) only when its
// entry is fresh: then it is returning from the handler that parked it.
func (p *parking) run(ctx context.Context, queue, id string, fresh bool) bool {
	deadline := time.Now().Add(returningFor)
	pause := returningFirst
	for {
		err := p.insp.RunTask(queue, id)
		switch {
		case err == nil:
			return true
		case strings.Contains(err.Error(), "already running"):
			if !fresh || time.Now().After(deadline) {
				return false // running again: a stale entry
			}
			select {
			case <-ctx.Done():
				return false
			case <-time.After(pause):
			}
			pause = min(2*pause, returningMax)
		case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound),
			strings.Contains(err.Error(), "pending"):
			return false
		default:
			p.log.Warn("worker: wake a parked task (it comes back by itself)", "queue", queue, "id", id, "err", err)
			return false
		}
	}
}
