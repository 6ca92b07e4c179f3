package semaphore

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Waiting. The Acquire calls of one Service waiting for one key stand in a
// local line, first come first served by their place (ticket: arrival by
// the Redis server's clock, in µs). The line takes a single entry in the
// key's fleet-wide line in Redis, stamped with the place of its first
// waiter, so that processes are served in the order their waiters came.
//
// A waiter's path:
//  1. arrive: with nobody of ours waiting for the key, the caller asks the
//     store itself (one script call that takes a seat, or joins the
//     fleet-wide line when there is none); with someone of ours waiting,
//     it queues behind them without a call.
//  2. wait: the line's goroutine (one per line, only while it has
//     waiters) asks the store for a seat for the first waiter each time it
//     is nudged: by a wake message (a release, a departure or a
//     force-release elsewhere publishes to the processes first in line),
//     by a local arrival or departure, or by its timer, which follows the
//     soonest lease expiry and is otherwise a backoff with jitter that is
//     only a safety net.
//  3. a release of ours may hand its seat over directly (handover.go).
//  4. leaving: a waiter that gives up leaves the local line at once; the
//     line that empties takes its entry out of the fleet-wide line, which
//     wakes whoever that entry held up from a free seat.

const (
	// lineEntryTTL is how long a line's entry in Redis outlives its last
	// refresh; a crashed process's entry stops blocking others after it.
	lineEntryTTL = 3 * time.Second
	backoffBase  = 20 * time.Millisecond
	backoffMax   = time.Second // keeps entries refreshed well within lineEntryTTL
	// listeningBackoff is the least backoff of a line whose entry stands
	// in the fleet-wide line while its Service listens for wake messages:
	// the release that frees its seat wakes it, so the backoff is only the
	// safety net for a lost message and need not poll Redis.
	listeningBackoff = 200 * time.Millisecond
)

var errNoWaiter = errors.New("semaphore: no waiter in line")

// waiter is one Acquire call waiting in a local line. Its fields are
// guarded by its line's mu until done is closed, and belong to the Acquire
// call after.
type waiter struct {
	req      request
	ticket   int64 // its place: arrival by the server's clock, µs
	attempts int   // store calls made on its behalf
	done     chan struct{}
	settled  bool
	handed   bool // the permit came by a local hand-over: the waiter adopts it
	permit   *Permit
	err      error
}

// line is the local line of one key.
type line struct {
	s   *Service
	key string
	k   keys
	// users counts the Acquire calls and the goroutine using the line;
	// the Service forgets the line when it drops to 0. Guarded by s.mu.
	users int
	wake  chan struct{} // nudges the line's goroutine

	mu sync.Mutex // guards everything below
	// attemptDone is signalled when a store call for the head returns
	// (attempting goes false): one is on the wire at a time.
	attemptDone *sync.Cond
	attempting  bool
	waiters     []*waiter // by ticket
	serving     bool      // the line's goroutine runs
	// queued says our entry may stand in the fleet-wide line; capacity is
	// the capacity our waiters asked for, which leaving counts free seats
	// with.
	queued   bool
	capacity int
	// direct counts the arrivals asking the store themselves; probe is
	// closed when the first of them (while none was on the wire) has its
	// answer, which simultaneous arrivals wait for.
	direct int
	probe  chan struct{}
	// aheadTicket is the place of the first entry of another process in
	// the fleet-wide line, as the last reply told; 0 if none.
	aheadTicket int64
	backoff     time.Duration // what the line's goroutine sleeps now (for tests)
}

func newLine(s *Service, key string) *line {
	l := &line{s: s, key: key, k: s.keysFor(key), wake: make(chan struct{}, 1)}
	l.attemptDone = sync.NewCond(&l.mu)
	return l
}

// useLine returns key's line, making it if need be, and counts the caller
// as a user until doneWithLine.
func (s *Service) useLine(key string) *line {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lines[key]
	if l == nil {
		l = newLine(s, key)
		s.lines[key] = l
	}
	l.users++
	return l
}

// doneWithLine drops a user of l, and forgets l when it was the last.
func (s *Service) doneWithLine(l *line) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.users--; l.users == 0 && s.lines[l.key] == l {
		delete(s.lines, l.key)
	}
}

// lineOf is key's line, nil when none of ours waits for key.
func (s *Service) lineOf(key string) *line {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lines[key]
}

// arrive starts w's wait. With nobody of ours waiting for the key, w asks
// the store itself; with someone of ours waiting, it queues behind them;
// while another arrival asks the store for the first time (the probe), it
// waits for that answer, so that a burst of callers on a full semaphore
// costs one store call, not one each. settled reports that the wait ended
// there (a seat, or an error); otherwise w stands in the line.
func (l *line) arrive(ctx context.Context, w *waiter) (p *Permit, attempts int, err error, settled bool) {
	probed := false
	for {
		l.mu.Lock()
		if len(l.waiters) > 0 || l.serving {
			w.ticket = w.req.cfg.ticket
			if w.ticket == 0 {
				w.ticket, _ = l.s.clock.now()
			}
			l.enqueue(w)
			l.mu.Unlock()
			return nil, 0, nil, false
		}
		if probe := l.probe; probe != nil && !probed {
			l.mu.Unlock()
			select {
			case <-probe:
			case <-ctx.Done():
				return nil, 0, &AcquisitionError{Key: l.key, Reason: ReasonCanceled, Err: ctx.Err()}, true
			case <-l.s.closed:
				return nil, 0, &AcquisitionError{Key: l.key, Reason: ReasonShutdown, Err: errShutdown}, true
			}
			// The probe found a free seat (or we would see a line now):
			// ask the store as it did.
			probed = true
			continue
		}
		isProbe := l.direct == 0 && !probed
		l.direct++
		if isProbe {
			l.probe = make(chan struct{})
		}
		l.mu.Unlock()
		p, err, settled := l.askStore(w, isProbe)
		return p, 1, err, settled
	}
}

// askStore is an arrival's own store call: it takes a seat, or joins the
// fleet-wide line and then the local line (one attempt only: it never
// queues).
func (l *line) askStore(w *waiter, isProbe bool) (*Permit, error, bool) {
	req := w.req
	args := newAcquireArgs(req)
	oneShot := req.cfg.maxAttempts == 1
	if !oneShot {
		args.entry = l.s.id
	}
	res, err := l.s.callAcquire(l.k, l.key, args)

	l.mu.Lock()
	l.direct--
	if isProbe {
		close(l.probe)
		l.probe = nil
	}
	if err != nil || res.granted || oneShot {
		l.mu.Unlock()
		switch {
		case err != nil:
			return nil, &AcquisitionError{Key: l.key, Reason: ReasonError, Attempts: 1, Err: err}, true
		case res.granted:
			p, _, err := l.s.keepUnlessClosed(req, res, 1)
			return p, err, true
		default:
			return nil, &AcquisitionError{Key: l.key, Reason: ReasonExhausted, Attempts: 1}, true
		}
	}
	// Full: our entry stands in the fleet-wide line now, with this
	// arrival's place.
	l.queued, l.capacity, l.aheadTicket = true, req.capacity, res.aheadTicket
	w.ticket, w.attempts = res.ticket, 1
	l.enqueue(w)
	l.mu.Unlock()
	return nil, nil, false
}

// enqueue puts w in line by its ticket and makes sure the line is served.
// Caller holds l.mu.
func (l *line) enqueue(w *waiter) {
	i := len(l.waiters)
	for i > 0 && l.waiters[i-1].ticket > w.ticket {
		i--
	}
	l.waiters = slices.Insert(l.waiters, i, w)
	if l.serving && i == 0 {
		// The line's goroutine may sleep a backoff meant for another
		// head, or for nobody: the newcomer must not wait for it.
		l.nudge()
	}
	l.ensureServing()
}

// ensureServing starts the line's goroutine unless it runs. Caller holds
// l.mu.
func (l *line) ensureServing() {
	if l.serving {
		return
	}
	l.serving = true
	l.s.mu.Lock()
	l.users++
	l.s.mu.Unlock()
	go l.serve()
}

// nudge makes the line's goroutine look again now.
func (l *line) nudge() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// serve is the line's goroutine: it asks for seats for the first waiter
// until the line is empty.
func (l *line) serve() {
	defer l.s.doneWithLine(l)
	if !l.s.listening() {
		// Not waited for: until wake messages reach us, backoffs stay
		// short (see safetyNet).
		go l.s.listen()
	}
	var wait time.Duration
	for {
		l.mu.Lock()
		l.backoff = wait
		l.mu.Unlock()
		l.pause(wait)
		if l.s.isClosed() {
			l.failAll(ReasonShutdown, errShutdown)
		}
		if l.stopIfEmpty() {
			return
		}
		wait = l.serveHead(wait)
	}
}

// pause sleeps d, or less when nudged or closed.
func (l *line) pause(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.wake:
	case <-t.C:
	case <-l.s.closed:
	}
}

// serveHead makes one attempt for the first waiter and says how long to
// wait before the next.
func (l *line) serveHead(prev time.Duration) time.Duration {
	res, err := l.attemptForHead(nil)
	switch {
	case errors.Is(err, errNoWaiter):
		return 0 // the last waiter just left: the line stops
	case err != nil:
		l.s.log.Warn("semaphore: acquire attempt failed", "key", l.key, "err", err)
		l.failAll(ReasonError, err)
		return 0
	case res.granted && (res.free > 0 || l.isEmpty()):
		return 0 // another seat is free, or the line stops
	case res.granted:
		// The call took the last free seat: another try now would only
		// fail. The next release wakes us.
		return l.nextDelay(0, res)
	}
	next := l.nextDelay(prev, res)
	if l.failExhausted() {
		return 0 // nobody left: leave the fleet-wide line at once
	}
	return next
}

// attemptForHead asks the store for a seat for the first waiter; release,
// when set, is a seat of ours handed over in the same call. A call on
// behalf of the line (release nil) counts an attempt for every waiter.
func (l *line) attemptForHead(release *Permit) (acquireReply, error) {
	l.mu.Lock()
	for l.attempting {
		l.attemptDone.Wait()
	}
	if len(l.waiters) == 0 {
		l.mu.Unlock()
		return acquireReply{}, errNoWaiter
	}
	head := l.waiters[0]
	args := newAcquireArgs(head.req)
	args.entry, args.ticket = l.s.id, head.ticket
	if len(l.waiters) > 1 {
		args.nextTicket = l.waiters[1].ticket
	}
	if release != nil {
		args.release = release.member
	} else {
		for _, w := range l.waiters {
			w.attempts++
		}
	}
	l.attempting, l.capacity = true, head.req.capacity
	l.mu.Unlock()

	res, err := l.s.callAcquire(l.k, l.key, args)
	var p *Permit
	if err == nil && res.granted {
		p = l.s.grant(head.req, res)
	}

	l.mu.Lock()
	l.attempting = false
	l.attemptDone.Broadcast()
	if err != nil {
		l.mu.Unlock()
		return res, err
	}
	l.queued = !res.granted || args.nextTicket != 0
	l.aheadTicket = res.aheadTicket
	var unused *Permit
	switch {
	case p == nil:
	case head.settled:
		// The head left, or took a seat handed over locally, while this
		// one was on the wire: give it back quietly.
		unused = p
	case l.s.isClosed():
		unused = p
		l.settle(head, nil, &AcquisitionError{Key: l.key, Reason: ReasonShutdown, Attempts: head.attempts, Err: errShutdown})
	default:
		l.settle(head, p, nil)
	}
	if l.queued {
		l.ensureServing() // whoever serves the line takes the entry out when it empties
	}
	l.mu.Unlock()
	if unused != nil {
		l.s.giveBack(unused)
	}
	return res, nil
}

// stopIfEmpty ends the line's service when no waiter is left, taking its
// entry out of the fleet-wide line.
func (l *line) stopIfEmpty() bool {
	l.mu.Lock()
	if len(l.waiters) > 0 {
		l.mu.Unlock()
		return false
	}
	l.serving = false
	leave, capacity := l.queued, l.capacity
	l.queued = false
	l.mu.Unlock()
	if leave {
		l.s.leaveLine(l.k, l.key, capacity)
	}
	return true
}

func (l *line) isEmpty() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiters) == 0
}

// settle ends w's wait with a permit or an error. Caller holds l.mu.
func (l *line) settle(w *waiter, p *Permit, err error) {
	if w.settled {
		return
	}
	w.settled, w.permit, w.err = true, p, err
	if i := slices.Index(l.waiters, w); i >= 0 {
		l.waiters = slices.Delete(l.waiters, i, i+1)
	}
	close(w.done)
}

// abandon ends w's wait with reason, unless it was already settled: a seat
// handed to it meanwhile is given back quietly.
func (l *line) abandon(w *waiter, reason Reason, cause error) {
	l.mu.Lock()
	if !w.settled {
		l.settle(w, nil, &AcquisitionError{Key: l.key, Reason: reason, Attempts: w.attempts, Err: cause})
		l.mu.Unlock()
		l.nudge() // a line left empty leaves the fleet-wide line now
		return
	}
	l.mu.Unlock()
	if p := w.permit; p != nil {
		w.permit = nil
		w.err = &AcquisitionError{Key: l.key, Reason: reason, Attempts: w.attempts, Err: cause}
		l.s.giveBack(p)
	}
}

// giveBack releases a seat nobody will use.
func (s *Service) giveBack(p *Permit) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := p.Release(ctx); err != nil {
		s.log.Warn("semaphore: give back an unused seat (it lapses with its lease)", "key", p.key, "err", err)
	}
}

// failAll ends every wait in the line with reason.
func (l *line) failAll(reason Reason, cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.waiters) > 0 {
		w := l.waiters[0]
		l.settle(w, nil, &AcquisitionError{Key: l.key, Reason: reason, Attempts: w.attempts, Err: cause})
	}
}

// failExhausted ends the waits that used up their WithMaxAttempts, and
// reports whether the line is empty after.
func (l *line) failExhausted() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range slices.Clone(l.waiters) {
		if n := w.req.cfg.maxAttempts; n > 0 && w.attempts >= n {
			l.settle(w, nil, &AcquisitionError{Key: l.key, Reason: ReasonExhausted, Attempts: w.attempts})
		}
	}
	return len(l.waiters) == 0
}

// nextDelay is the backoff after an attempt that left our entry in the
// fleet-wide line: twice the last, jittered, up to backoffMax, cut short to
// the soonest lease expiry. It starts from backoffBase, or from
// listeningBackoff while wake messages reach us: then the release that
// frees a seat wakes us, and the backoff is only a safety net.
func (l *line) nextDelay(prev time.Duration, res acquireReply) time.Duration {
	floor := backoffBase
	if l.s.listening() {
		floor = listeningBackoff
	}
	d := min(max(prev*2, floor), backoffMax)
	d = d/2 + rand.N(d/2+1)
	if !res.earliest.IsZero() {
		if e := res.earliest.Sub(res.now) + 2*time.Millisecond; e < d {
			d = max(e, time.Millisecond)
		}
	}
	return d
}
