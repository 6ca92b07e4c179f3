package asynqx

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/rediskey"
)

// ServerClient is the Redis client of an asynq server (give it to
// asynq.NewServerFromRedisClient). It passes every call through, but two:
//
//   - Dequeue: asynq's processor asks each queue in turn for a task (a
//     script call per queue) and, when all were empty, sleeps and asks
//     again: polling. Once a round found every queue empty, ServerClient
//     holds the next ask until a task is pushed onto one of the queues or
//     maxIdle passes (see "Waiting for work"): an idle worker costs Redis
//     little, and a new task is taken within a few round trips. Set
//     asynq's TaskCheckInterval to a millisecond or so: its own sleep then
//     no longer matters. A dequeue takes a task handed to it by Claim
//     first.
//   - Archive: a handler that sends its task back to wait (fleetcap's
//     requeue) would have it archived when it has no retry left, whatever
//     IsFailure says. For a task Keep was called for, ServerClient moves
//     it to the retry set instead, with its ID, its retry count and the
//     error message asynq meant to archive it with.
type ServerClient struct {
	redis.UniversalClient
	prefix  string // the fleet's, which starts the idle keys (see idleKeys)
	queues  map[string]bool
	maxIdle time.Duration
	log     *slog.Logger

	id string // this client's name in the duty leases

	mu      sync.Mutex
	empty   map[string]bool      // queues found empty since a task was last taken
	waiting bool                 // a dequeue waits for work
	onDuty  map[string]time.Time // queues whose duty this worker holds, and when it last took or kept it
	backlog map[string]*backlog  // per queue: what its dequeues found lately (see noteDequeue)
	// saturation hands the duty on unless the worker asks for another task
	// first (see stillFree)
	saturation *time.Timer
	arms       map[string]chan struct{}
	work       chan struct{} // a watcher saw work
	claimed    chan struct{} // a task was handed to the dequeue that waits (Claim)
	stop       chan struct{}
	stopped    bool
	kept       map[string]kept // task id -> where Keep sends it instead of the archive
	claims     []*claim        // tasks for the next dequeue to take (see Claim)
}

// backlog is what a worker's dequeues of one queue found lately, for its
// backlog rings (see recruit).
type backlog struct {
	took bool          // the last dequeue of the queue found a task
	rang time.Time     // when the worker last rang the queue's doorbell for a backlog
	gap  time.Duration // the least time between two of those rings
}

type kept struct {
	delay time.Duration
	until time.Time // forgotten after: asynq gave up writing the task (its lease ran out)
}

// NewServerClient wraps rdb for an asynq server that serves queues, in the
// fleet whose keys start with prefix (config semaphore.prefix): the idle
// workers of one fleet watch its queues together, and no other fleet's.
func NewServerClient(rdb redis.UniversalClient, prefix string, queues []string, maxIdle time.Duration, log *slog.Logger) *ServerClient {
	c := &ServerClient{UniversalClient: rdb, prefix: prefix, queues: map[string]bool{}, maxIdle: maxIdle, log: log, id: newID(),
		empty: map[string]bool{}, onDuty: map[string]time.Time{}, backlog: map[string]*backlog{}, arms: map[string]chan struct{}{}, work: make(chan struct{}, 1), claimed: make(chan struct{}, 1),
		stop: make(chan struct{}), kept: map[string]kept{}}
	for _, q := range queues {
		c.queues[q] = true
	}
	return c
}

// Stop ends every wait for work and lets later dequeues through at once,
// and hands on the watch of the queues this worker holds, so that a push
// wakes another idle worker at once: call it before the asynq server's
// Stop, which waits for the dequeue in progress.
func (c *ServerClient) Stop() {
	c.mu.Lock()
	var held []string
	if !c.stopped {
		c.stopped = true
		close(c.stop)
		for q := range c.onDuty {
			held = append(held, q)
		}
	}
	c.mu.Unlock()
	for _, q := range held {
		c.passOn(q)
	}
}

// EvalSha runs a script by its hash; see ServerClient.
func (c *ServerClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return c.intercept(ctx, keys, args, func() *redis.Cmd { return c.UniversalClient.EvalSha(ctx, sha, keys, args...) })
}

// Eval runs a script; see ServerClient.
func (c *ServerClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return c.intercept(ctx, keys, args, func() *redis.Cmd { return c.UniversalClient.Eval(ctx, script, keys, args...) })
}

func (c *ServerClient) intercept(ctx context.Context, keys []string, args []any, run func() *redis.Cmd) *redis.Cmd {
	if q, ok := dequeueQueue(keys); ok && c.queues[q] {
		c.stillFree()
		if cmd := c.takeClaimed(ctx, q, args); cmd != nil {
			return cmd
		}
		byClaim := c.waitForWork()
		if cmd := c.takeClaimed(ctx, q, args); cmd != nil {
			if byClaim {
				c.stillEmpty() // nothing was pushed: the next dequeue waits at once
			}
			return cmd
		}
		cmd := run()
		c.noteDequeue(q, cmd)
		return cmd
	}
	if id, ok := archiveTask(keys, args); ok {
		if k, ok := c.takeKept(id); ok {
			return c.retryInstead(ctx, keys, args, k)
		}
	}
	return run()
}

// dequeueQueue recognizes asynq's dequeue script by its keys: the queue's
// pending, paused, active and lease keys.
func dequeueQueue(keys []string) (string, bool) {
	if len(keys) != 4 {
		return "", false
	}
	q, ok := queueOf(keys[0], "pending")
	if !ok {
		return "", false
	}
	k := QueueKeys(q)
	return q, keys[1] == "asynq:{"+q+"}:paused" && keys[2] == k.Active && keys[3] == k.Lease
}

// queueOf reads the queue of a key asynq:{queue}:<suffix>.
func queueOf(key, suffix string) (string, bool) {
	rest, ok := strings.CutPrefix(key, "asynq:{")
	if !ok {
		return "", false
	}
	q, ok := strings.CutSuffix(rest, "}:"+suffix)
	return q, ok && q != ""
}

// Waiting for work. Of the idle workers of a fleet, one per queue is on
// duty (a lease in Redis): it waits with BLMOVE on the queue's pending list
// and sees every push. The others wait on the queue's doorbell list
// (BLPOP), which wakes one waiter per ring. A worker that leaves its wait
// with a task keeps the duty while it has slots to spare (it asks for the
// next task at once); one that does not ask again within saturated, its
// slots full, hands the duty on and rings the doorbell once: the worker it
// wakes takes the duty, and a task of its own if more came. A worker whose
// ask finds a task right after one that found a task too (a backlog) rings
// once more, and again at most every saturated for as long as it keeps
// finding tasks: so a burst recruits idle workers one after another, and
// so does a backlog that grows behind a worker that never waits (its slots
// free one at a time, each taken at once, while the others sit idle). The
// doorbell keeps at most one ring nobody waited for, and a worker whose
// rings go untaken (nobody is idle) rings less and less often (recruit).
// So a push costs the same few commands whatever the size of the fleet,
// and no idle worker polls. The worker on duty renews its lease at most
// once a second (see takeDuty), however many tasks trickle in.

// waitForWork holds a dequeue while every queue was found empty, until a
// watcher sees work, a task is claimed for it (then it reports true),
// maxIdle passes, or Stop.
func (c *ServerClient) waitForWork() (byClaim bool) {
	c.mu.Lock()
	if c.stopped || len(c.empty) < len(c.queues) {
		c.mu.Unlock()
		return false
	}
	clear(c.empty)
	c.waiting = true
	for q := range c.queues {
		arm, ok := c.arms[q]
		if !ok {
			arm = make(chan struct{}, 1)
			c.arms[q] = arm
			go c.watch(q, arm)
		}
		select {
		case arm <- struct{}{}:
		default: // still watching from the last wait
		}
	}
	c.mu.Unlock()
	t := time.NewTimer(c.maxIdle)
	defer t.Stop()
	select {
	case <-c.work:
	case <-c.claimed:
		byClaim = true
	case <-t.C:
	case <-c.stop:
	}
	c.mu.Lock()
	c.waiting = false
	c.mu.Unlock()
	return byClaim
}

// stillEmpty notes that every queue is as empty as when the dequeue that
// took a claimed task began to wait: no watcher saw work meanwhile (one
// that sees it later wakes the next wait at once).
func (c *ServerClient) stillEmpty() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for q := range c.queues {
		c.empty[q] = true
	}
}

// noteDequeue records what a dequeue of q found. After a task taken on
// duty, the worker hands the duty on unless it asks for another task
// within saturated (see stillFree); a task taken right after another of
// the same queue (whatever the other queues answered between them, as
// asynq asks each queue in turn) is a backlog, and rings for another
// worker (see "Waiting for work").
func (c *ServerClient) noteDequeue(q string, cmd *redis.Cmd) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.backlog[q]
	if b == nil {
		b = &backlog{gap: saturated}
		c.backlog[q] = b
	}
	switch err := cmd.Err(); {
	case errors.Is(err, redis.Nil):
		c.empty[q] = true
		b.took = false
	case err == nil:
		clear(c.empty)
		c.keepDutyWhileFree(q)
		if now := time.Now(); b.took && now.Sub(b.rang) >= b.gap {
			b.rang = now
			go c.recruit(q, b)
		}
		b.took = true
	}
}

// keepDutyWhileFree notes that a dequeue of q took a task: a worker on
// duty keeps the duty only while it asks for more (see stillFree). The
// caller holds c.mu.
func (c *ServerClient) keepDutyWhileFree(q string) {
	if _, on := c.onDuty[q]; on {
		c.saturation = time.AfterFunc(saturated, func() { c.passOn(q) })
	}
}

// ring wakes one idle worker waiting on q's doorbell. It reports whether
// it rang: false when a ring nobody took waits there already (no worker is
// idle), or Redis failed (logged).
func (c *ServerClient) ring(q string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	duty, bell := c.idleKeys(q)
	rung, err := dutyScript.Run(ctx, c.UniversalClient, []string{duty, bell}, "ring", c.id, c.maxIdle.Milliseconds()).Int()
	if err != nil {
		c.log.Warn("asynqx: wake another worker for a backlog (it looks again after its idle time)", "queue", q, "err", err)
	}
	return err == nil && rung == 1
}

// recruit rings q's doorbell for a backlog of b. While its rings go
// untaken (the last one still waits on the doorbell: no worker is idle) it
// rings half as often each time, down to once every maxRingGap, so that a
// fleet whose workers are all busy does not ring for nobody; a ring taken
// brings it back to every saturated.
func (c *ServerClient) recruit(q string, b *backlog) {
	rung := c.ring(q)
	c.mu.Lock()
	defer c.mu.Unlock()
	if rung {
		b.gap = saturated
	} else {
		b.gap = min(2*b.gap, maxRingGap)
	}
}

// maxRingGap bounds the time between two backlog rings of a worker whose
// rings go untaken; a ring waits on the doorbell for maxIdle, longer.
const maxRingGap = time.Second

// saturated is how soon a worker with a slot to spare asks for its next
// task after taking one: asynq's processor asks at once.
const saturated = 10 * time.Millisecond

// stillFree notes that the worker asks for another task: it has a slot to
// spare, and keeps the duty.
func (c *ServerClient) stillFree() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.saturation != nil {
		c.saturation.Stop()
		c.saturation = nil
	}
}

// passOn gives up the duty of q, if this worker holds it, and rings q's
// doorbell once, so that another idle worker takes the duty (and a task,
// if more came).
func (c *ServerClient) passOn(q string) {
	c.mu.Lock()
	delete(c.onDuty, q)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	duty, bell := c.idleKeys(q)
	if err := dutyScript.Run(ctx, c.UniversalClient, []string{duty, bell}, "pass", c.id, c.maxIdle.Milliseconds()).Err(); err != nil {
		c.log.Warn("asynqx: hand on the watch of a queue (it lapses by itself)", "queue", q, "err", err)
	}
}

// idleKeys are the duty lease and the doorbell of q in this fleet, in q's
// hash tag.
func (c *ServerClient) idleKeys(q string) (duty, bell string) {
	base := rediskey.Idle(c.prefix, q)
	return base + "duty", base + "bell"
}

//go:embed lua/duty.lua
var dutySrc string

var dutyScript = redis.NewScript(dutySrc)

// takeDuty takes or keeps the duty of q, for a lease of maxIdle (its
// longest wait) plus dutyMargin. A duty this worker took or kept within
// dutyMargin is kept without asking Redis, as the lease still outlasts the
// wait that follows: so a worker on duty that picks up a trickle of tasks,
// one at a time, asks about once a second, not once a task.
func (c *ServerClient) takeDuty(ctx context.Context, q string) (bool, error) {
	lease := c.maxIdle + dutyMargin
	c.mu.Lock()
	at, on := c.onDuty[q]
	c.mu.Unlock()
	if on && time.Since(at) < dutyMargin {
		return true, nil
	}
	duty, bell := c.idleKeys(q)
	now := time.Now()
	onDuty, err := dutyScript.Run(ctx, c.UniversalClient, []string{duty, bell}, "take", c.id, lease.Milliseconds()).Bool()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && onDuty {
		c.onDuty[q] = now
	} else {
		delete(c.onDuty, q)
	}
	return err == nil && onDuty, err
}

// dutyMargin is how much longer than its wait the duty of a queue is
// leased.
const dutyMargin = time.Second

// callTimeout bounds the short calls of the idle machinery.
const callTimeout = 5 * time.Second

// watch waits for work on q each time it is armed: on duty, until q's
// pending list holds a task; off duty, until the doorbell rings. It then
// signals the dequeue that waits, or, when none waits any more (the worker
// got busy), rings the doorbell for another. A paused queue is not watched:
// its tasks cannot be taken.
func (c *ServerClient) watch(q string, arm <-chan struct{}) {
	k := QueueKeys(q)
	_, bell := c.idleKeys(q)
	paused := "asynq:{" + q + "}:paused"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.stop
		cancel()
	}()
	for {
		select {
		case <-arm:
		case <-c.stop:
			return
		}
		onDuty, err := c.takeDuty(ctx, q)
		if err == nil && onDuty {
			var n int64
			if n, err = c.UniversalClient.Exists(ctx, paused).Result(); err == nil && n > 0 {
				continue // the dequeue's own wait (maxIdle) looks again later
			}
		}
		if err == nil {
			if onDuty {
				err = c.UniversalClient.BLMove(ctx, k.Pending, k.Pending, "RIGHT", "RIGHT", c.maxIdle).Err()
			} else {
				err = c.UniversalClient.BLPop(ctx, c.maxIdle, bell).Err()
			}
		}
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, redis.Nil):
			continue // nothing came within maxIdle
		case err != nil:
			c.log.Warn("asynqx: wait for tasks in a queue (the worker looks again after its idle time)", "queue", q, "err", err)
			continue
		}
		c.mu.Lock()
		waiting := c.waiting
		c.mu.Unlock()
		if !waiting {
			// Busy now: the work is another worker's.
			if onDuty {
				c.passOn(q)
			} else {
				c.ring(q) // the ring this took
			}
			continue
		}
		select {
		case c.work <- struct{}{}:
		default:
		}
	}
}

// Keep makes the archive of task id, if asynq is about to archive it (it
// has no retry left), a retry after delay instead; the caller returns its
// requeue error next. It expires after a while, should asynq not write
// the task (its lease ran out).
func (c *ServerClient) Keep(id string, delay time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for k, v := range c.kept {
		if now.After(v.until) {
			delete(c.kept, k)
		}
	}
	c.kept[id] = kept{delay: delay, until: now.Add(keptFor)}
}

// keptFor bounds how long Keep waits for asynq to archive the task: its
// lease (30 s), with a margin.
const keptFor = time.Minute

func (c *ServerClient) takeKept(id string) (kept, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.kept[id]
	delete(c.kept, id)
	return k, ok && time.Now().Before(k.until)
}

// Kept reports whether Keep is waiting to turn the archive of id into a
// retry (for the log line asynq writes before it archives).
func (c *ServerClient) Kept(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.kept[id]
	return ok
}

// archiveTask recognizes asynq's archive script by its keys: the task's
// hash, the queue's active, lease and archived keys, and five more; and
// reads the task id, its first argument.
func archiveTask(keys []string, args []any) (string, bool) {
	if len(keys) != 9 || len(args) < 2 {
		return "", false
	}
	q, ok := queueOf(keys[3], "archived")
	if !ok {
		return "", false
	}
	k := QueueKeys(q)
	id, ok := args[0].(string)
	if !ok || keys[0] != k.TaskPrefix+id || keys[1] != k.Active || keys[2] != k.Lease {
		return "", false
	}
	return id, true
}

//go:embed lua/keep.lua
var keepSrc string

var keepScript = redis.NewScript(keepSrc)

// retryInstead moves the task asynq was about to archive to the retry set,
// and answers as asynq's archive script would.
func (c *ServerClient) retryInstead(ctx context.Context, keys []string, args []any, k kept) *redis.Cmd {
	q, _ := queueOf(keys[3], "archived")
	qk := QueueKeys(q)
	id := args[0].(string)
	cmd := keepScript.Run(ctx, c.UniversalClient, []string{keys[0], qk.Active, qk.Lease, qk.Retry},
		id, args[1], time.Now().Add(k.delay).Unix())
	if cmd.Err() != nil {
		c.log.Warn("asynqx: keep a requeued task with no retry left out of the archive", "queue", q, "id", id, "err", cmd.Err())
	}
	return cmd
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
