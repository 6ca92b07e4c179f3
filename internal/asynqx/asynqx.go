// Package asynqx holds everything fleetcap relies on that asynq does not
// promise. The rest of fleetcap reaches asynq through its public API and
// this package only. It assumes, of asynq PinnedVersion:
//
//   - the keys of a queue (QueueKeys): asynq:{queue}:pending, active,
//     lease, retry, scheduled, and a hash per task at asynq:{queue}:t:<id>;
//   - a task hash's fields "state" (pending, active, scheduled, retry,
//     archived, completed) and "msg", the encoded task, in which a task's
//     last error message and its headers appear verbatim;
//   - enqueue pushes onto the left of pending and dequeue takes from the
//     right, so a task pushed on the right runs next (Wake,
//     RecoverExpired);
//   - an active task's lease is its score in the lease set, Unix seconds;
//   - the keys and arguments of asynq's dequeue and archive scripts, and
//     the states they leave (ServerClient);
//   - the warning asynq logs before it archives a task (ExhaustedTaskID).
//
// seam_test.go pins each assumption against the asynq that go.mod
// requires: an upgrade that changes one fails there, loudly, before it
// can misbehave in a fleet.
package asynqx

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// PinnedVersion is the asynq release whose internals this package was
// written against and is tested with.
const PinnedVersion = "v0.26.0"

// Keys are the Redis keys of one asynq queue; they share the hash tag
// {queue}, so a script may use them together on a Cluster.
type Keys struct {
	Pending    string // LIST of task ids: enqueue LPUSHes, dequeue takes the right end
	Active     string // LIST of ids being processed
	Lease      string // ZSET id -> lease expiry, Unix s
	Retry      string // ZSET id -> when to retry, Unix s
	Scheduled  string // ZSET id -> when to process, Unix s
	Paused     string // STRING, set while the queue is paused
	TaskPrefix string // + id: the task's HASH (state, msg, ...)
}

// QueueKeys returns the keys of queue.
func QueueKeys(queue string) Keys {
	p := "asynq:{" + queue + "}:"
	return Keys{Pending: p + "pending", Active: p + "active", Lease: p + "lease", Retry: p + "retry",
		Scheduled: p + "scheduled", Paused: p + "paused", TaskPrefix: p + "t:"}
}

// Task reports the state asynq records for a task ("pending", "active",
// "retry", ...) and its encoded message ("" and "" when the task does not
// exist).
func Task(ctx context.Context, rdb redis.Cmdable, queue, id string) (state, msg string, err error) {
	vals, err := rdb.HMGet(ctx, QueueKeys(queue).TaskPrefix+id, "state", "msg").Result()
	if err != nil {
		return "", "", fmt.Errorf("asynqx: read task %s of queue %q: %w", id, queue, err)
	}
	state, _ = vals[0].(string)
	msg, _ = vals[1].(string)
	return state, msg, nil
}

//go:embed lua/waits.lua
var waitsSrc string

//go:embed lua/wake.lua
var wakeSrc string

var wakeScript = redis.NewScript(waitsSrc + wakeSrc)

// WakeResult is what Wake did.
type WakeResult int

// The results of Wake.
const (
	Gone   WakeResult = iota // the task no longer waits for the seat (ran, deleted, waits for another key): left alone
	Woken                    // the task is at the dequeuing end of its queue
	Busy                     // the task is being processed: it may be about to wait
	Paused                   // the task's queue is paused: it waits there, pending, until the queue resumes
)

// Wake moves a task that waits for a seat to the dequeuing end of its
// queue, so that it runs next, but only while it still waits for that
// seat: in the retry set with retryMark in its message (sent back by its
// handler), in the scheduled set with scheduledMark in it (enqueued to
// wait), or pending already (run by hand, or woken before).
func Wake(ctx context.Context, rdb redis.Scripter, queue, id, retryMark, scheduledMark string) (WakeResult, error) {
	k := QueueKeys(queue)
	n, err := wakeScript.Run(ctx, rdb, []string{k.TaskPrefix + id, k.Retry, k.Scheduled, k.Pending, k.Paused},
		id, retryMark, scheduledMark, time.Now().UnixNano()).Int()
	if err != nil {
		return Gone, fmt.Errorf("asynqx: wake task %s of queue %q: %w", id, queue, err)
	}
	switch n {
	case 1:
		return Woken, nil
	case 2:
		return Busy, nil
	case 3:
		return Paused, nil
	}
	return Gone, nil
}

// Missing returns the tasks of ids in queue that no longer exist or are
// done (completed, archived): whatever removed them, they wait for nothing.
// A task in the scheduled or retry set costs nothing more than the two
// ZMSCOREs of the whole batch; others are looked up one by one.
func Missing(ctx context.Context, rdb redis.UniversalClient, queue string, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	k := QueueKeys(queue)
	pipe := rdb.Pipeline()
	scheduled := pipe.ZMScore(ctx, k.Scheduled, ids...)
	retry := pipe.ZMScore(ctx, k.Retry, ids...)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("asynqx: look up tasks of queue %q: %w", queue, err)
	}
	var others []string
	for i, id := range ids {
		if scheduled.Val()[i] == 0 && retry.Val()[i] == 0 {
			others = append(others, id)
		}
	}
	if len(others) == 0 {
		return nil, nil
	}
	states := make([]*redis.StringCmd, len(others))
	pipe = rdb.Pipeline()
	for i, id := range others {
		states[i] = pipe.HGet(ctx, k.TaskPrefix+id, "state")
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	var gone []string
	for i, id := range others {
		if err := states[i].Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("asynqx: look up task %s of queue %q: %w", id, queue, err)
		}
		switch states[i].Val() {
		case "", "completed", "archived":
			gone = append(gone, id)
		}
	}
	return gone, nil
}

//go:embed lua/recover.lua
var recoverSrc string

var recoverScript = redis.NewScript(recoverSrc)

// RecoverExpired brings back, to the dequeuing end of queue, the active
// tasks whose lease expired before cutoff (their worker died or lost
// Redis), as asynq's own requeue does but without spending a retry; each
// task at most maxTimes. It returns the ids brought back.
func RecoverExpired(ctx context.Context, rdb redis.Scripter, queue string, cutoff time.Time, maxTimes int) ([]string, error) {
	k := QueueKeys(queue)
	ids, err := recoverScript.Run(ctx, rdb, []string{k.Active, k.Lease, k.Pending}, cutoff.Unix(), k.TaskPrefix, maxTimes).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("asynqx: recover tasks of queue %q: %w", queue, err)
	}
	return ids, nil
}

// ExhaustedTaskID reads the warning asynq logs before it archives a task
// with no retry left ("Retry exhausted for task id=<id>").
func ExhaustedTaskID(logLine string) (id string, ok bool) {
	return strings.CutPrefix(logLine, "Retry exhausted for task id=")
}
