package semaphore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var errNoWaiter = errors.New("semaphore: no waiter in line")

// Waiting. The waiters of one Service for one key stand in a local line,
// first come first served. The line takes a single entry in the key's
// fleet-wide line in Redis, stamped with the arrival (server time) of its
// first waiter, so that processes are served in the order their waiters
// came. One goroutine per line (only while it has waiters) asks the store
// for a seat on behalf of the first waiter when it is woken: by a wake
// message (a release, a departure or a force-release elsewhere publishes to
// the Services first in line), by a timer on the soonest lease expiry, or by
// a backoff with jitter that is only the safety net. A local release hands
// its seat to the first local waiter: at once, in memory, when no other
// process is known to wait ahead of it and the lease runs long enough
// (one script call then moves the seat on the store, see handOverLocally);
// otherwise through the store, in the releasing script call, which
// respects the fleet-wide line.

const (
	// lineEntryTTL is how long a line's entry in Redis outlives its last
	// refresh; a crashed process's entry stops blocking others after it.
	lineEntryTTL = 3 * time.Second
	backoffBase  = 20 * time.Millisecond
	backoffMax   = time.Second // keeps entries refreshed well within lineEntryTTL
	// wokenBackoff is the first backoff of a waiter that stands in the
	// fleet-wide line while its Service listens for wake messages: the
	// release that frees its seat wakes it, so the backoff is only the
	// safety net for a lost message and need not poll Redis.
	wokenBackoff = 200 * time.Millisecond
)

// waiter is one Acquire call waiting in a local line.
type waiter struct {
	req      request
	ticket   int64 // arrival, server µs
	attempts int   // guarded by line.mu until done is closed
	done     chan struct{}
	settled  bool // guarded by line.mu
	handed   bool // the permit came by a local hand-over: the waiter adopts it
	permit   *Permit
	err      error
	line     *line
}

// line is the local line of one key.
type line struct {
	s       *Service
	key     string
	mu      sync.Mutex // guards waiters, running and waiter fields
	waiters []*waiter
	running bool
	// guarded by Service.mu: direct attempts in flight, and the probe
	// that simultaneous arrivals wait on
	inflight int
	probe    chan struct{}
	kick     chan struct{}
	grantMu  sync.Mutex // one grant attempt in flight per line
	queued   bool       // guarded by grantMu: our entry may stand in the fleet-wide line
	// other is the ticket of the first entry of another process in the
	// fleet-wide line (0: none), as the last script reply told; guarded by mu
	other int64
}

// noteOther records what a script reply told about other processes'
// entries in the fleet-wide line.
func (l *line) noteOther(ticket int64) {
	l.mu.Lock()
	l.other = ticket
	l.mu.Unlock()
}

// arrive finds key's line for a new Acquire. When direct is not nil the
// caller asks the store itself (nobody of ours is waiting) and must call
// direct once, after joining the line if it did. The first of several
// simultaneous arrivals probes alone and the others wait for its answer, so
// a burst of callers on a full semaphore costs one store call, not one each.
func (s *Service) arrive(ctx context.Context, key string) (l *line, direct func(joined bool)) {
	probed := false
	for {
		s.mu.Lock()
		l = s.lines[key]
		if l == nil {
			l = &line{s: s, key: key, kick: make(chan struct{}, 1)}
			s.lines[key] = l
		}
		l.mu.Lock()
		busy := len(l.waiters) > 0 || l.running
		l.mu.Unlock()
		if busy {
			s.mu.Unlock()
			return l, nil
		}
		if probe := l.probe; probe != nil && !probed {
			s.mu.Unlock()
			select {
			case <-probe:
			case <-ctx.Done():
				return l, nil // joins and is settled as canceled at once
			case <-s.closed:
				return l, nil
			}
			// The probe found a free seat (or we would see a line now):
			// go straight to the store, as the probe did.
			probed = true
			continue
		}
		var probe chan struct{}
		if l.inflight == 0 && !probed {
			probe = make(chan struct{})
			l.probe = probe
		}
		l.inflight++
		s.mu.Unlock()
		return l, func(joined bool) {
			s.mu.Lock()
			defer s.mu.Unlock()
			l.inflight--
			if probe != nil {
				l.probe = nil
				close(probe)
			}
			l.forgetIfIdle()
		}
	}
}

// join puts w at the end of the line, starting the line's goroutine when it
// is not running.
func (l *line) join(w *waiter) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.lines[l.key] != l {
		// The line was dropped from the map meanwhile: put it back.
		if cur := l.s.lines[l.key]; cur != nil {
			l = cur
		} else {
			l.s.lines[l.key] = l
		}
	}
	l.mu.Lock()
	l.waiters = append(l.waiters, w)
	w.line = l
	start := !l.running
	first := len(l.waiters) == 1
	l.running = true
	l.mu.Unlock()
	if start {
		go l.run()
	} else if first {
		// The line's goroutine may be waiting out a backoff with nobody
		// in line: the newcomer must not wait for it.
		l.wakeUp()
	}
}

// lineOf is key's line, nil when none of ours waits for key.
func (s *Service) lineOf(key string) *line {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lines[key]
}

// forgetIfIdle drops the line from the map when nothing uses it. Caller
// holds s.mu.
func (l *line) forgetIfIdle() {
	l.mu.Lock()
	idle := len(l.waiters) == 0 && !l.running && l.inflight == 0 && l.probe == nil
	l.mu.Unlock()
	if idle && l.s.lines[l.key] == l {
		delete(l.s.lines, l.key)
	}
}

// wakeUp makes the line's goroutine try again now.
func (l *line) wakeUp() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// settle ends w's wait with a permit or an error. Caller holds l.mu.
func (l *line) settle(w *waiter, p *Permit, err error) {
	if w.settled {
		return
	}
	w.settled, w.permit, w.err = true, p, err
	for i, o := range l.waiters {
		if o == w {
			l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
			break
		}
	}
	close(w.done)
}

// abandon ends w's wait with reason, unless a seat was already granted to
// it: that seat is handed on (or given back) quietly.
func (l *line) abandon(w *waiter, reason Reason, cause error) {
	l.mu.Lock()
	if !w.settled {
		l.settle(w, nil, &AcquisitionError{Key: l.key, Reason: reason, Attempts: w.attempts, Err: cause})
		l.mu.Unlock()
		l.wakeUp()
		return
	}
	p := w.permit
	l.mu.Unlock()
	if p != nil {
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

// run serves the line until it is empty.
func (l *line) run() {
	s := l.s
	if err := s.subscribeWake(); err != nil {
		s.log.Warn("semaphore: wake subscription failed; waiting on backoff only", "key", l.key, "err", err)
	}
	delay := time.Duration(0)
	for {
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-l.kick:
			case <-t.C:
			case <-s.closed:
			}
			t.Stop()
		}
		if s.isClosed() {
			l.failAll(ReasonShutdown, errShutdown)
		}
		if l.stopIfEmpty() {
			return
		}
		res, err := l.tryHead(nil)
		switch {
		case errors.Is(err, errNoWaiter):
			delay = 0 // the last waiter just left: stopIfEmpty ends the line
		case err != nil:
			s.log.Warn("semaphore: acquire attempt failed", "key", l.key, "err", err)
			l.failAll(ReasonError, err)
		case res.granted && res.free > 0:
			delay = 0 // another seat is free: try again at once
		case res.granted && l.empty():
			delay = 0 // stopIfEmpty ends the line
		case res.granted:
			// The call took the last free seat: another try now would
			// only fail. The next release wakes us.
			delay = l.safetyNet(res)
		case delay == 0:
			// Our entry stands in the fleet-wide line now: a release
			// wakes us.
			delay = l.safetyNet(res)
			l.failExhausted()
		default:
			delay = l.nextDelay(delay, res)
			l.failExhausted()
		}
	}
}

// empty reports whether nobody waits in the line.
func (l *line) empty() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiters) == 0
}

// safetyNet is the first backoff after an attempt that left the line
// queued in the fleet-wide line: long while wake messages reach us (see
// wokenBackoff), backoffBase when they do not.
func (l *line) safetyNet(res attemptResult) time.Duration {
	if l.s.subscribed() {
		return l.nextDelay(wokenBackoff/2, res)
	}
	return l.nextDelay(0, res)
}

// nextDelay is the backoff after a full attempt, cut short to the soonest
// lease expiry.
func (l *line) nextDelay(prev time.Duration, res attemptResult) time.Duration {
	d := backoffBase
	if prev > 0 {
		d = min(prev*2, backoffMax)
	}
	d = d/2 + rand.N(d/2+1)
	if !res.earliest.IsZero() {
		if e := res.earliest.Sub(res.now) + 2*time.Millisecond; e < d {
			d = max(e, time.Millisecond)
		}
	}
	return d
}

// stopIfEmpty ends the line when no waiter is left, taking its entry out of
// the fleet-wide line.
func (l *line) stopIfEmpty() bool {
	s := l.s
	s.mu.Lock()
	l.mu.Lock()
	if len(l.waiters) > 0 {
		l.mu.Unlock()
		s.mu.Unlock()
		return false
	}
	l.running = false
	l.mu.Unlock()
	l.forgetIfIdle()
	s.mu.Unlock()
	l.grantMu.Lock()
	queued := l.queued
	l.queued = false
	l.grantMu.Unlock()
	if queued {
		// Leaving also wakes whoever our entry held up.
		s.leaveLine(request{key: l.key, k: s.keysFor(l.key), capacity: 1})
	}
	return true
}

// tryHead asks the store for a seat for the first waiter; release, when
// set, is a seat of ours handed over in the same call. It counts an attempt
// for every waiter in line.
func (l *line) tryHead(release *Permit) (attemptResult, error) {
	l.grantMu.Lock()
	l.mu.Lock()
	if len(l.waiters) == 0 {
		l.mu.Unlock()
		l.grantMu.Unlock()
		return attemptResult{}, errNoWaiter
	}
	head := l.waiters[0]
	next := ""
	if len(l.waiters) > 1 {
		next = strconv.FormatInt(l.waiters[1].ticket, 10)
	}
	releaseMember := ""
	if release != nil {
		releaseMember = release.member
	} else {
		for _, w := range l.waiters {
			w.attempts++
		}
	}
	req := head.req
	ticket := strconv.FormatInt(head.ticket, 10)
	l.mu.Unlock()

	res, err := l.s.attempt(req, l.s.id, ticket, next, releaseMember)
	if err != nil {
		l.grantMu.Unlock()
		return res, err
	}
	l.queued = !res.granted || next != ""
	var unused *Permit
	if res.granted {
		p := l.s.grant(req, res)
		l.mu.Lock()
		l.other = res.other
		if head.settled || l.s.isClosed() {
			// The head left, or took a seat handed over locally, or we are
			// shutting down, while this seat was on the wire: give it back
			// quietly (below, once grantMu is free: giving back may hand
			// the seat on).
			unused = p
			if !head.settled {
				l.settle(head, nil, &AcquisitionError{Key: l.key, Reason: ReasonShutdown, Attempts: head.attempts, Err: errShutdown})
			}
		} else {
			l.settle(head, p, nil)
		}
		l.mu.Unlock()
	} else {
		l.noteOther(res.other)
	}
	l.grantMu.Unlock()
	if unused != nil {
		l.s.giveBack(unused)
	}
	return res, nil
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

// failExhausted ends the waits that used up their WithMaxAttempts.
func (l *line) failExhausted() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range append([]*waiter(nil), l.waiters...) {
		if n := w.req.cfg.maxAttempts; n > 0 && w.attempts >= n {
			l.settle(w, nil, &AcquisitionError{Key: l.key, Reason: ReasonExhausted, Attempts: w.attempts})
		}
	}
}

// handOver releases p, handing its seat to the first local waiter of its
// key in the same script call when the fleet-wide line allows. It reports
// whether p still held its seat, and false for handed when this Service has
// no waiter for the key (the caller then releases plainly).
func (s *Service) handOver(p *Permit) (held, handed bool, err error) {
	if s.isClosed() {
		return false, false, nil
	}
	l := s.lineOf(p.key)
	if l == nil {
		return false, false, nil
	}
	res, err := l.tryHead(p)
	if err == errNoWaiter {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	s.woke(p.key, res.token)
	return res.released == 1, true, nil
}

// localHandOverMargin is how far ahead a releasing permit's lease must still
// run (by the local clock, which errs early) for its seat to go straight to
// a local waiter: far more than the one script call that moves the seat on
// the store takes, so that the seat is held there throughout.
const localHandOverMargin = time.Second

// handOverLocally gives p's seat at once to the first local waiter of its
// key, without a round trip before the waiter runs, when no other process
// is known to wait ahead of that waiter: the seat stays taken on the store
// and one script call moves it from p to the waiter's new permit. That call
// is made before handOverLocally returns; the new permit does nothing on
// the store until it is answered. If the seat turns out lost, p's release
// reports it and the new permit is marked lost (Lost is closed). It
// reports handed false when it did not hand the seat over: the caller then
// takes the fair path through the store.
func (s *Service) handOverLocally(p *Permit) (held, handed bool, err error) {
	if s.isClosed() {
		return false, false, nil
	}
	p.mu.Lock()
	ok := !p.isLost && !p.handedOff && time.Until(p.deadline) > localHandOverMargin
	p.mu.Unlock()
	if !ok {
		return false, false, nil
	}
	l := s.lineOf(p.key)
	if l == nil {
		return false, false, nil
	}
	l.mu.Lock()
	if len(l.waiters) == 0 {
		l.mu.Unlock()
		return false, false, nil
	}
	head := l.waiters[0]
	if head.req.capacity != p.capacity || (l.other != 0 && l.other < head.ticket) {
		// A capacity of its own asks the store; a waiter of another
		// process came first: the fair path serves it.
		l.mu.Unlock()
		return false, false, nil
	}
	next := ""
	if len(l.waiters) > 1 {
		next = strconv.FormatInt(l.waiters[1].ticket, 10)
	}
	q := s.handedPermit(head.req)
	p.mu.Lock()
	p.handedOff = true
	p.mu.Unlock()
	// The call that moves the seat goes first, then the waiter is woken:
	// it runs while this goroutine waits for the reply.
	k := p.k
	sent := time.Now()
	call := &evalCall{script: handoffScript, keys: []string{k.holders, k.queue, k.qexp, k.parked},
		args: []any{p.member, q.member, q.ttl.Milliseconds(), s.id, next, lineEntryTTL.Milliseconds(), s.wakeFlag()}}
	s.batch.of(k.holders).submit(call)
	s.localHandOvers.Add(1)
	head.handed = true
	l.settle(head, q, nil)
	empty := len(l.waiters) == 0
	l.mu.Unlock()
	if empty {
		l.wakeUp() // the line's goroutine takes our entry out of the line
	}
	<-call.done
	vals, err := call.cmd.Slice()
	var nums [4]int64
	if err == nil && len(vals) != len(nums)+1 {
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
		return false, true, err
	}
	l.noteOther(nums[2])
	s.clock.observe(nums[3], sent, time.Now())
	token, _ := vals[4].(string)
	s.woke(p.key, token)
	q.handOverDone(nums[0] == 1, time.UnixMilli(nums[1]))
	return nums[0] == 1, true, nil
}

// subscribed reports whether this Service listens for wake messages.
func (s *Service) subscribed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wake != nil
}

// subscribeWake subscribes, once, to this Service's wake channel, and waits
// until Redis confirms it so that no wake message sent after an attempt can
// be missed.
func (s *Service) subscribeWake() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wake != nil || s.isClosed() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	ps := s.rdb.Subscribe(ctx, s.wakePrefix()+s.id)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return err
	}
	s.wake = ps
	go s.readWake(ps)
	return nil
}

// readWake wakes the line named by each wake message.
func (s *Service) readWake(ps *redis.PubSub) {
	for msg := range ps.Channel() {
		if l := s.lineOf(msg.Payload); l != nil {
			l.wakeUp()
		}
	}
}
