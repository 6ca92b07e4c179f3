package semaphore

import (
	"fmt"
	"time"
)

// Releasing a seat. A release hands the seat to this Service's first waiter
// of the key when it may:
//   - in memory, at once (handOverLocally), when no waiter of another
//     process stands ahead of ours: the seat stays taken on the store and
//     one script call moves it to the waiter's new permit;
//   - otherwise in the same script call that frees the seat
//     (handOverThroughStore), which follows the fleet-wide line.
//
// With no local waiter it is a plain script call (releasePlain) that wakes
// whoever is first in line. Every path that frees a held seat, or gives one
// to a task of the waiting room, also lets the next tokens out of the room
// (see Enter) and hands them to Options.OnWake.

// localHandOverMargin is how far ahead a releasing permit's lease must still
// run (by the local clock, which errs early) for its seat to go straight to
// a local waiter: far more than the one script call that moves the seat on
// the store takes, so that the seat is held there throughout.
const localHandOverMargin = time.Second

// release frees p's seat on the store, handing it to a local waiter when
// there is one. It reports whether p still held the seat.
func (s *Service) release(p *Permit) (bool, error) {
	p.awaitReady()
	if l := s.lineOf(p.key); l != nil && !s.isClosed() {
		if held, handed, err := l.handOverLocally(p); handed {
			return held, err
		}
		if held, handed, err := l.handOverThroughStore(p); handed {
			return held, err
		}
	}
	return s.releasePlain(p)
}

// handOverLocally gives p's seat to the first local waiter in memory, when
// no waiter of another process is known to stand ahead of it. It reports
// handed false when it did not: the caller then takes another path.
func (l *line) handOverLocally(p *Permit) (held, handed bool, err error) {
	if !p.mayHandOverLocally() {
		return false, false, nil
	}
	sent := time.Now()
	call, q, ok := l.settleHeadWith(p)
	if !ok {
		return false, false, nil
	}
	l.s.localHandOvers.Add(1)
	held, err = l.moveSeat(call, q, sent)
	return held, true, err
}

// mayHandOverLocally reports whether p's seat may go to a local waiter in
// memory: it is held, was not handed on yet, and its lease runs long enough
// for the store to learn of the move in time.
func (p *Permit) mayHandOverLocally() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.isLost && !p.handedOff && time.Until(p.deadline) > localHandOverMargin
}

// settleHeadWith is the first step of a local hand-over: it gives the first
// waiter a new permit q for p's seat and sends the script call that moves
// the seat from p to q on the store (q does nothing on the store until that
// call is answered). ok is false when the head may not have it: nobody
// waits, the head asked for another capacity (it asks the store), or a
// waiter of another process came first (the fair path serves it).
func (l *line) settleHeadWith(p *Permit) (call *evalCall, q *Permit, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.waiters) == 0 {
		return nil, nil, false
	}
	head := l.waiters[0]
	if head.req.capacity != p.capacity || (l.aheadTicket != 0 && l.aheadTicket < head.ticket) {
		return nil, nil, false
	}
	var next int64
	if len(l.waiters) > 1 {
		next = l.waiters[1].ticket
	}
	q = l.s.handedPermit(head.req)
	p.mu.Lock()
	p.handedOff = true
	p.mu.Unlock()
	// The call goes first, then the waiter wakes: it runs while the
	// releasing goroutine waits for the reply.
	call = &evalCall{script: handoffScript, keys: l.k.all(),
		args: []any{p.member, q.member, q.ttl.Milliseconds(), l.s.id, ticketArg(next), lineEntryTTL.Milliseconds(), head.req.cfg.token}}
	l.s.batch.of(l.k.holders).submit(call)
	head.handed = true
	l.settle(head, q, nil)
	if len(l.waiters) == 0 {
		// The call takes our entry out of the fleet-wide line; the line's
		// goroutine stops.
		l.nudge()
	}
	return call, q, true
}

// moveSeat is the second step of a local hand-over: it waits for the call
// that moved the seat and settles q with its answer. It reports whether
// the releasing permit still held the seat; sent is when the call left.
func (l *line) moveSeat(call *evalCall, q *Permit, sent time.Time) (bool, error) {
	<-call.done
	vals, err := call.cmd.Slice()
	var nums [4]int64
	if err == nil && len(vals) != len(nums) {
		err = fmt.Errorf("semaphore: hand-over script replied %d values", len(vals))
	}
	for i := 0; err == nil && i < len(nums); i++ {
		if nums[i], err = replyInt(vals[i]); err != nil {
			err = fmt.Errorf("semaphore: hand-over script reply %d: %w", i, err)
		}
	}
	if err != nil {
		// Whether the seat moved is unknown: the new permit cannot count
		// on it.
		q.handOverDone(false, time.Time{})
		return false, err
	}
	moved := nums[0] == 1
	l.mu.Lock()
	l.aheadTicket = nums[2]
	l.mu.Unlock()
	l.s.clock.observe(nums[3], sent, time.Now())
	q.handOverDone(moved, time.UnixMilli(nums[1]))
	return moved, nil
}

// handOverThroughStore releases p and asks for a seat for the first local
// waiter in the same script call, which follows the fleet-wide line. It
// reports handed false when no waiter of ours is left.
func (l *line) handOverThroughStore(p *Permit) (held, handed bool, err error) {
	res, err := l.attemptForHead(p)
	switch {
	case err == errNoWaiter:
		return false, false, nil
	case err != nil:
		return false, true, err
	}
	return res.released == 1, true, nil
}

// releasePlain frees p's seat, decides "held" by the store's clock, and
// wakes the waiters first in line, in one call.
func (s *Service) releasePlain(p *Permit) (bool, error) {
	vals, err := s.batch.of(p.k.holders).run(releaseScript, p.k.all(), p.member, p.capacity, s.wakePrefix(), p.key, s.wakeFlag()).Slice()
	if err != nil {
		return false, err
	}
	if len(vals) != 2 {
		return false, fmt.Errorf("semaphore: release script replied %d values", len(vals))
	}
	n, err := replyInt(vals[0])
	if err != nil {
		return false, err
	}
	s.woke(p.key, replyStrings(vals[1]))
	return n == 1, nil
}
