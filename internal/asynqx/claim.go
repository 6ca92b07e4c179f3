package asynqx

import (
	"context"
	_ "embed"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Claiming a woken task. A task let out of a waiting room by this worker
// (the seat of a task it ran went on, and a place with it) would go to the
// dequeuing end of its queue (Wake) for the next dequeue of the fleet to
// pop it: two script calls. When this worker has a slot free, its own next
// dequeue takes the task instead, by its ID, straight from where it waits
// to the active list (claim.lua): one call, and no trip through the queue.

//go:embed lua/claim.lua
var claimSrc string

var claimScript = redis.NewScript(waitsSrc + claimSrc)

// claimGrace is how long Claim waits for a dequeue of this worker to take
// the task before it leaves the task to Wake: a slot that frees as the task
// is let out (the task whose seat went on just ended) asks within it, once
// asynq has marked that task done. Measured in S5 at 1 process (every slot
// taken, so each claim waits for one to free): p50 1.0 ms, p90 2.6 ms, p99
// 7.9 ms. A claim that misses costs the task a trip through its queue, a
// dequeue and an enter (about 14 commands more); one that waits in vain
// (no slot frees: its tasks run long) delays only that trip.
const claimGrace = 10 * time.Millisecond

// A claim is a task waiting for this worker's next dequeue.
type claim struct {
	queue, id                string
	retryMark, scheduledMark string
	done                     chan claimed // one reply, from the dequeue that took it
}

type claimed struct {
	res     WakeResult
	handled bool // false: not claimed; the caller wakes the task
}

// Claim hands a task that waits for a seat (see Wake for the marks) to
// this worker's next dequeue, which runs it in the slot it frees. It
// reports what the dequeue found; handled is false when no dequeue waits
// for work now nor comes within claimGrace (no slot is free), the worker
// stops, it does not serve queue, or the task is not where a claim takes
// it from (it is pending, or its queue is paused): then the caller wakes
// it with Wake, as before.
func (c *ServerClient) Claim(queue, id, retryMark, scheduledMark string) (res WakeResult, handled bool) {
	cl := &claim{queue: queue, id: id, retryMark: retryMark, scheduledMark: scheduledMark, done: make(chan claimed, 1)}
	c.mu.Lock()
	if c.stopped || !c.queues[queue] {
		c.mu.Unlock()
		return Gone, false
	}
	c.claims = append(c.claims, cl)
	waiting := c.waiting
	if waiting {
		// The dequeue that waits takes it as it wakes, whatever woke it.
		select {
		case c.claimed <- struct{}{}:
		default: // woken already
		}
	}
	c.mu.Unlock()
	var grace <-chan time.Time
	if !waiting {
		t := time.NewTimer(claimGrace)
		defer t.Stop()
		grace = t.C
	}
	select {
	case r := <-cl.done:
		return r.res, r.handled
	case <-grace:
	case <-c.stop:
	}
	c.mu.Lock()
	if i := slices.Index(c.claims, cl); i >= 0 {
		c.claims = slices.Delete(c.claims, i, i+1)
		c.mu.Unlock()
		return Gone, false
	}
	c.mu.Unlock()
	r := <-cl.done // a dequeue took it: it answers once its call returns
	return r.res, r.handled
}

// takeClaimed runs the claims waiting for a dequeue, first come first
// served, until one yields a task; it returns that task's message as the
// reply of asynq's dequeue call of q (whose arguments are args), or nil
// when none did. The task may be of another queue than q: asynq reads its
// queue from the message. A task taken counts as one the dequeue of q
// found, for the duty of watching q (it is no backlog: see noteDequeue).
func (c *ServerClient) takeClaimed(ctx context.Context, q string, args []any) *redis.Cmd {
	if len(args) == 0 {
		return nil
	}
	for {
		c.mu.Lock()
		if c.stopped || len(c.claims) == 0 {
			c.mu.Unlock()
			return nil
		}
		cl := c.claims[0]
		c.claims = c.claims[1:]
		c.mu.Unlock()
		if cmd := c.runClaim(ctx, cl, args[0]); cmd != nil {
			c.mu.Lock()
			c.keepDutyWhileFree(q)
			c.mu.Unlock()
			return cmd
		}
	}
}

// runClaim runs cl's claim.lua with the lease a dequeue was given, and
// answers cl.
func (c *ServerClient) runClaim(ctx context.Context, cl *claim, lease any) *redis.Cmd {
	k := QueueKeys(cl.queue)
	v, err := claimScript.Run(ctx, c.UniversalClient, []string{k.TaskPrefix + cl.id, k.Retry, k.Scheduled, k.Active, k.Lease, k.Paused},
		cl.id, cl.retryMark, cl.scheduledMark, lease).Result()
	if err != nil {
		// Not claimed: the caller wakes the task instead. (Had the script
		// run, the task is active under the lease, and asynq's recoverer
		// brings it back once that runs out, as after a lost dequeue.)
		c.log.Warn("asynqx: claim a woken task for this worker (it is woken through its queue instead)", "queue", cl.queue, "id", cl.id, "err", err)
		cl.done <- claimed{}
		return nil
	}
	switch v := v.(type) {
	case string:
		cl.done <- claimed{res: Woken, handled: true}
		cmd := redis.NewCmd(ctx)
		cmd.SetVal(v)
		return cmd
	case int64:
		switch v {
		case 0:
			cl.done <- claimed{res: Gone, handled: true}
			return nil
		case 2:
			cl.done <- claimed{res: Busy, handled: true}
			return nil
		case 4: // pending, or its queue is paused: Wake's to handle
			cl.done <- claimed{}
			return nil
		}
	}
	c.log.Error("asynqx: claim.lua replied what this build does not know (the task is woken through its queue instead)", "queue", cl.queue, "id", cl.id, "reply", v)
	cl.done <- claimed{}
	return nil
}
