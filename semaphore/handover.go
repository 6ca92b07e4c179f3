package semaphore

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Handing a seat over in memory. When a Service releases a seat while its
// own Acquire waiter stands first in the key's line (the last reply of a
// call on the key said so, counting the waiters handed seats since, and
// no task waits in the key's room), it gives the seat to that waiter at
// once, in memory, and moves it on the store after (handover.lua): the
// waiter starts a round trip sooner (S3 contended). The seat stays held under the releasing member until the
// move, so the cap holds throughout; the waiter's fence is drawn by the
// move, and its Fence waits for it. A move that finds the releasing seat
// lost, or cannot reach the store, leaves the waiter's permit lost.
//
// What the Service knows of the head can be stale in one way only: a
// waiter of another process that waited behind (behind.go) may join ahead
// of it meanwhile, the window the README names.
//
// A task standing by (Entry.Wait, of one seat, no fair share, starting as
// its seat comes) takes a seat of its own process in memory the same way
// while the key's room holds tokens: the replies of release.lua and
// handover.lua name the first tokens in line (next, for free: grant looks
// at them anyway), and a seat given back goes to the first of them while
// it is this process's task standing by, for nextHeadFor after the reply.
// Its move also gives its standby place on and lets the next parked token
// out in it (enrolled, with Room.Enrol), as a release's settleown does;
// that token comes back as the task settles (Entry.Settle waits for the
// move). Until a move answered, the calls of this Service on the key name
// the tokens moving (handing), so that no seat goes to them twice. A token
// that arrived before them and joins the line within nextHeadFor of the
// reply (one whose task stepped aside and comes back) is served after
// them: the window the README names. Between two processes a seat still
// goes through the store.

var handoverScript = roomScript("handover.lua")

// acquireTokenPrefix starts the tokens of Acquire calls (tasks' tokens
// are their queue and ID).
const acquireTokenPrefix = "w:"

// pendingFence is the fence of a seat handed over in memory, known once
// handover.lua answers (moved reports whether the waiter holds its seat).
// For a task standing by (task: handed by standingHead), the move also
// says whether its standby place went on with the seat (settled), and the
// tokens let out in it (later), which its Entry's Settle hands on as the
// task starts.
type pendingFence struct {
	done    chan struct{}
	fence   uint64
	moved   bool
	now     time.Time // the server's time of the move
	task    bool
	settled bool
	later   []string
	// For a task: member is its seat's; mu guards what a call that gave
	// it a seat meanwhile let out in its place (meanwhile, and whether
	// that call gave the place on), and settling, set once its Entry took
	// what the move said (see handedMeanwhile).
	member    string
	mu        sync.Mutex
	meanwhile []string
	placeGone bool
	settling  bool
}

// wait returns what the move answered, once it did: the fence, whether
// the seat moved, and the server's time of the move (a move that did not
// answer within storeTimeout counts as not moved).
func (f *pendingFence) wait() (fence uint64, moved bool, now time.Time) {
	t := time.NewTimer(storeTimeout)
	defer t.Stop()
	select {
	case <-f.done:
		return f.fence, f.moved, f.now
	case <-t.C:
		return 0, false, time.Time{}
	}
}

// nextHeadFor is how long what a reply said of the tokens first in a
// key's line (noteNext) is taken for true (Service.nextHeadFor): a token
// that arrived before them and joins the line later (one that stepped
// aside and comes back, say) may be served after them if it joins within
// that time.
const nextHeadFor = 100 * time.Millisecond

// noteNext records the tokens first in key's line by r ("next"); a reply
// that does not say, but gave seats, makes it forget the ones noted: the
// line's head moved. (A call that only added tokens to the line added
// them behind, but for the window nextHeadFor bounds; each token noted is
// looked at again as a seat goes to it, and those that left the line
// since, a token handed a seat in memory among them, are passed over:
// standingHead.)
func (s *Service) noteNext(key string, r reply) {
	_, said := r["next"]
	if !said && len(r.strings("granted")) == 0 {
		return
	}
	next := r.strings("next")
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	kw := s.waits.keys[key]
	if kw == nil {
		return
	}
	kw.next, kw.nextAt = next, time.Now()
}

// handingArgs name, for a call on key, this Service's tokens of key on
// their way to a seat handed in memory, but for except (see handing in
// room.lua).
func (s *Service) handingArgs(key, except string) []any {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	kw := s.waits.keys[key]
	if kw == nil || len(kw.handing) == 0 {
		return nil
	}
	var args []any
	n := 0
	for t := range kw.handing {
		if t != except {
			n++
			args = append(args, "h"+strconv.Itoa(n), t)
		}
	}
	if n == 0 {
		return nil
	}
	return append(args, "handing", n)
}

// handed notes that the move of key's token handed a seat in memory
// answered (or failed).
func (s *Service) handed(key, token string) {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	if kw := s.waits.keys[key]; kw != nil {
		delete(kw.handing, token)
	}
}

// noteHead records what a reply said of key's line: its first waiting
// tokens, and whether no task waits in its room (clear).
func (s *Service) noteHead(key string, r reply) {
	if _, ok := r["head"]; !ok {
		return
	}
	line := r.strings("head")
	clear, _ := r.int("clear")
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	if kw := s.waits.keys[key]; kw != nil {
		kw.line, kw.clear = line, clear == 1
	}
}

// wantsHead reports whether this Service has Acquire waiters of key (the
// ones a seat may be handed to in memory), whose calls on the key should
// learn the line's head.
func (s *Service) wantsHead(key string) bool {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	kw := s.waits.keys[key]
	return kw != nil && kw.acquires > 0
}

// takeLocalHead returns this Service's waiter that stands first in p's
// key's line, as far as it knows, when p's seat may go to it in memory,
// and marks it done so that no other seat is delivered to it. When
// another of its waiters of the same shape waits behind (behind.go), that
// one takes over the head's token, and its seat request and place, and
// the head takes that one's permit id for its seat: since is then the
// arrival the token keeps (0: the token leaves the line). For a task
// standing by (standingHead), move is the move its seat is handed with.
func (s *Service) takeLocalHead(p *Permit) (w *waiter, since int64, move *pendingFence) {
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	kw := r.keys[p.key]
	if kw == nil {
		return nil, 0, nil
	}
	if w := kw.standingHead(r, p, s.nextHeadFor); w != nil {
		pf := &pendingFence{done: make(chan struct{}), task: true, member: w.member}
		if !s.handedSeats.Note(letOutKey(p.key, w.token), pf) {
			kw.next = nil
			return nil, 0, nil // too many moves on the wire: release.lua serves it
		}
		kw.next = kw.next[1:]
		if kw.handing == nil {
			kw.handing = map[string]bool{}
		}
		kw.handing[w.token] = true
		w.done = true
		return w, 0, pf
	}
	if !kw.clear || len(kw.line) == 0 {
		return nil, 0, nil
	}
	w = r.waiters[waitKey{p.key, kw.line[0]}]
	if w == nil || w.done || !w.joined || !joinEnded(w) || len(w.seat) > 0 ||
		!w.isAcquire() || w.req.cfg.seats != p.cfg.seats || w.req.cfg.share != "" {
		return nil, 0, nil
	}
	kw.line = kw.line[1:] // its token leaves that place in line
	if b := kw.sameShapeBehind(w); b != nil {
		r.passToken(kw, w, b)
		return w, b.since, nil
	}
	w.done = true
	return w, 0, nil
}

// standingHead is this Service's task standing by that is first in the
// key's line, by a reply within fresh (less the tokens that left the line
// since), when p's seat may go to it in memory: a task of one seat and no
// fair share that starts as its seat comes, whose Entry waits
// (Entry.Wait) with its standby place, and which has no seat yet. Caller
// holds the registry's mu.
func (kw *keyWaits) standingHead(r *waitRegistry, p *Permit, fresh time.Duration) *waiter {
	if time.Since(kw.nextAt) > fresh {
		return nil
	}
	// Tokens of this Service that left the line since the reply was made
	// (seated, or gone) are passed over: the reply may have been on its
	// way while they left.
	var w *waiter
	for len(kw.next) > 0 {
		w = r.waiters[waitKey{p.key, kw.next[0]}]
		if (w != nil && !w.done) || (w == nil && !r.leftLine.Recent(letOutKey(p.key, kw.next[0]))) {
			break
		}
		kw.next, w = kw.next[1:], nil
	}
	if w == nil || w.done || !w.standing || !w.joined || len(w.seat) > 0 || w.place == "" ||
		!w.req.cfg.startsOnSeat || w.req.cfg.seats != 1 || p.cfg.seats != 1 || w.req.cfg.share != "" || w.req.cfg.room == nil {
		kw.next = nil // the store knows whom the seat goes to
		return nil
	}
	return w
}

// sameShapeBehind is the first waiter behind w that asked for a seat of
// the same shape (lease, capacity, weight, label: what the room's slots
// entry of w's token says), or nil. Caller holds the registry's mu.
func (kw *keyWaits) sameShapeBehind(w *waiter) *waiter {
	for _, b := range kw.behind {
		if !b.done && b.req.cfg.ttl == w.req.cfg.ttl && b.req.capacity == w.req.capacity &&
			b.req.cfg.seats == w.req.cfg.seats && b.req.cfg.holder == w.req.cfg.holder {
			return b
		}
	}
	return nil
}

// handOver gives p's seat to this Service's first waiter of the key in
// memory and moves it on the store. done is false when none may take it:
// the caller releases p through release.lua.
func (s *Service) handOver(p *Permit) (held, done bool, err error) {
	if p.from != nil || !p.liveLocally() {
		return false, false, nil
	}
	w, since, pf := s.takeLocalHead(p)
	if w == nil {
		return false, false, nil
	}
	// Once, whatever comes of the move: a Release called again after a
	// failed one goes through release.lua.
	p.mu.Lock()
	p.handedOff = true
	p.mu.Unlock()
	task := pf != nil
	if task {
		s.taskMoves.Add(1)
	} else {
		pf = &pendingFence{done: make(chan struct{})}
	}
	w.seat <- seatMsg{member: w.member, pending: pf} // its one seat: w is done for every other delivery
	s.localHandOvers.Add(1)
	defer close(pf.done)
	args := s.settleArgs(p.key, "member", p.member, "seats", p.cfg.seats, "token", w.token,
		"wmember", w.member, "wttl", w.req.cfg.ttl.Milliseconds(), "capacity", p.capacity)
	if since > 0 {
		args = append(args, "since", strconv.FormatInt(since, 10))
	}
	if task {
		// Its place goes on with the seat, as a release's settleown gives
		// it on, and the next token let out in it may stand by as this
		// process's (enrol.go).
		args = append(append(args, "task", "1", "place", w.place), w.req.cfg.room.args()...)
		if s.enrols(w.req) {
			args = append(args, enrolArgs(w.req)...)
		}
		args = append(args, s.handingArgs(p.key, w.token)...)
		defer s.handed(p.key, w.token)
		if p.surelyLive() {
			args = append(args, "live", "1")
		}
	}
	rep, err := s.runBatched(handoverScript, p.k, args...)
	if err != nil {
		// The waiter's permit counts as lost; a Release called again frees
		// the holder's seat, if the move did not.
		return false, true, err
	}
	if task {
		settled, _ := rep.int("settled")
		pf.settled, pf.later = settled == 1, rep.strings("later")
		if inline, _ := rep.int("inline"); inline == 1 {
			s.handedSeats.Forget(letOutKey(p.key, w.token)) // no other call gave its token a seat
		}
		s.enrolled(w.req, rep)
	}
	moved, errMoved := rep.int("moved")
	wasHeld, errHeld := rep.int("held")
	fence, errFence := rep.uint("fence")
	now, errNow := rep.int("now")
	if err := errors.Join(errMoved, errHeld, errFence, errNow); err != nil {
		return false, true, fmt.Errorf("semaphore: handover.lua's reply: %w", err)
	}
	pf.fence, pf.moved, pf.now = fence, moved == 1, time.UnixMilli(now)
	s.passOn(p.key, rep, time.Time{}) // also notes the line's head
	return wasHeld == 1, true, nil
}

// handedMeanwhile takes m, a seat that a call gave key's token on the
// store and no waiter here took, when the token's task was handed a seat
// in memory (its move then finds that seat, and the task runs on it): the
// tokens the call let out in the task's place come back as the task
// starts (its Entry's Settle), or now if it did. It reports whether m was
// such a seat.
func (s *Service) handedMeanwhile(key, token string, m seatMsg) bool {
	pf, ok := s.handedSeats.Take(letOutKey(key, token))
	if !ok {
		return false
	}
	if pf.member != m.member {
		s.handedSeats.Note(letOutKey(key, token), pf)
		return false
	}
	pf.mu.Lock()
	settling := pf.settling
	if !settling {
		pf.meanwhile = append(pf.meanwhile, m.later...)
		pf.placeGone = pf.placeGone || m.settled
	}
	pf.mu.Unlock()
	if settling {
		s.woke(key, m.later)
	}
	return true
}

// localHandOverMargin is how far ahead a releasing permit's lease must
// still run (by the local clock, which errs early) for its seat to go to a
// waiter in memory: far more than the call that moves the seat takes, so
// that the seat stays held on the store until then.
const localHandOverMargin = time.Second

// liveLocally reports whether p's seat may go to a waiter in memory: it is
// not known lost, and its lease runs long enough.
func (p *Permit) liveLocally() bool {
	p.mu.Lock()
	handedOff := p.handedOff
	p.mu.Unlock()
	return !handedOff && !isDone(p.lost) && time.Until(p.localDeadline()) > localHandOverMargin
}

// resolveHandOver waits for the move of p, a seat handed over in memory,
// and applies it: p is lost when its seat did not move.
func (p *Permit) resolveHandOver() {
	if !p.awaitMove() {
		p.markLost()
	}
}

// awaitMove waits, for a seat handed over in memory, until its move
// answered (up to storeTimeout), and takes the lease the move gave it: the
// seat is under p's member on the store only then. It reports whether p's
// seat is (or was) its own on the store.
func (p *Permit) awaitMove() bool {
	pf := p.pending
	if pf == nil {
		return true
	}
	p.fenceOnce.Do(func() {
		fence, moved, now := pf.wait()
		p.mu.Lock()
		p.fence, p.moved = fence, moved
		if moved {
			p.acquiredAt, p.expiresAt = now, now.Add(p.ttl)
		}
		p.mu.Unlock()
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.moved
}
