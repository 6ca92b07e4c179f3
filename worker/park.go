package worker

import (
	"context"
	_ "embed"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// parking keeps, per semaphore key, the line of tasks that went back to
// asynq for want of a seat, so that a release wakes one at once
// (Inspector.RunTask moves it from retry to pending) instead of leaving it to
// asynq's forwarder. A release count guards the gap between a failed try and
// parking: a task parks only if no seat was released since it looked, so no
// wake-up is lost. Both keys share the semaphore's hash tag.
type parking struct {
	rdb    redis.UniversalClient
	insp   *asynq.Inspector
	prefix string
	log    *slog.Logger
}

//go:embed lua/park.lua
var parkSrc string

//go:embed lua/wake.lua
var wakeSrc string

var (
	parkScript = redis.NewScript(parkSrc)
	wakeScript = redis.NewScript(wakeSrc)
)

// parkedTTL bounds how long the parked line and release count of an idle
// key live: past parkDelay every parked task came back by itself.
const parkedTTL = 3 * parkDelay

func (p *parking) keys(key string) []string {
	base := p.prefix + "{" + key + "}:"
	return []string{base + "parked", base + "released"}
}

// releases reads key's release count, to pass to park.
func (p *parking) releases(ctx context.Context, key string) (string, error) {
	n, err := p.rdb.Get(ctx, p.keys(key)[1]).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return n, err
}

// park puts a task at the end of key's parked line, unless a seat of key was
// released since the count seen was read: then it reports false.
func (p *parking) park(ctx context.Context, key, seen, queue, taskID string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	n, err := parkScript.Run(ctx, p.rdb, p.keys(key), seen, queue+"\x00"+taskID, parkedTTL.Milliseconds()).Int()
	return n == 1, err
}

// wake counts a release of key and moves the first task still parked on it
// back to its queue. Entries whose task is gone or already pending (brought
// back by the safety-net delay) are skipped.
func (p *parking) wake(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 16 {
		entry, err := wakeScript.Run(ctx, p.rdb, p.keys(key), parkedTTL.Milliseconds()).Text()
		if errors.Is(err, redis.Nil) {
			return
		}
		if err != nil {
			p.log.Warn("worker: wake a parked task (it comes back by itself)", "key", key, "err", err)
			return
		}
		queue, id, ok := strings.Cut(entry, "\x00")
		if ok && p.run(ctx, queue, id) {
			return
		}
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
