package semaphore

import (
	"strconv"
	"time"
)

// Waiting behind. Of a Service's waiters of one key, the first joinAhead
// (one more than the key's capacity, at most maxJoinAhead) join the room
// in Redis; an Acquire that comes after them waits behind them in this
// process, with its arrival by the server's clock as this process reckons
// it (the clock offset every reply refines), and joins the room in its
// turn, as those ahead of it are served or leave, keeping that arrival. So a crowd of
// waiters costs Redis the joins and leaves of a few (S4: 200 waiters that
// time out together), and they are still served first come first served
// across the fleet, up to the round trip of a late join. Tasks standing
// by, and waiters of a fair key (whose place the room reckons), always
// join. A waiter in the room that gives up while another waits behind it
// hands it its token (handOn): the one behind takes its place in line, a
// little ahead of its own arrival, and no call is made.

const maxJoinAhead = 32

// joinAhead is how many waiters of a key of capacity seats a Service keeps
// in the room: as many as seats can free at once, and one more, so that
// while the next waiter's late join is on the wire one of its process's
// waiters still holds its place in line; within maxJoinAhead.
func joinAhead(capacity int) int { return min(max(capacity, 1)+1, maxJoinAhead) }

// waitBehind registers w (a new Acquire) to wait behind this Service's
// waiters of its key, when enough of them are in the room and this
// process knows the server's time; it reports whether it did. Otherwise
// the caller adds w and joins the room (add).
func (s *Service) waitBehind(w *waiter) bool {
	if w.req.cfg.share != "" {
		return false
	}
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	kw := r.keys[w.req.key]
	if kw == nil || kw.joined < joinAhead(w.req.capacity) || r.closed {
		return false
	}
	since, known := s.clock.now()
	if !known {
		return false
	}
	w.behind, w.since = true, since
	r.waiters[waitKey{w.req.key, w.token}] = w
	kw.n++
	kw.acquires++
	kw.capacity = w.req.capacity
	kw.behind = append(kw.behind, w)
	return true
}

// promote lets the waiters behind of key join the room, first come first
// served, while fewer than joinAhead of this Service's are in it.
func (s *Service) promote(key string) {
	r := &s.waits
	r.mu.Lock()
	kw := r.keys[key]
	var next []*waiter
	for kw != nil && !r.closed && len(kw.behind) > 0 && kw.joined < joinAhead(kw.capacity) {
		w := kw.behind[0]
		kw.behind = kw.behind[1:]
		if w.done {
			continue
		}
		w.behind, w.inRoom = false, true
		w.joining = make(chan struct{})
		kw.joined++
		next = append(next, w)
	}
	r.mu.Unlock()
	for _, w := range next {
		go s.joinLate(w)
	}
}

// joinLate joins the room for w, which waited behind, with its arrival.
func (s *Service) joinLate(w *waiter) {
	defer close(w.joining)
	p, rep, err := s.ask(w.req, w, "join", "new", "1", "since", strconv.FormatInt(w.since, 10))
	switch {
	case err != nil:
		s.failWaiter(w, &AcquisitionError{Key: w.req.key, Reason: ReasonError, Attempts: s.attemptsOf(w), Err: err})
	case p != nil:
		s.deliverPermit(w, p)
	default:
		s.waitsHere(w)
		s.setEarliest(w.req.key, rep)
	}
}

// failWaiter ends w's wait with err, unless it ended already.
func (s *Service) failWaiter(w *waiter, err error) {
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	if !w.done {
		w.done = true
		w.fail = err
		close(w.failed)
	}
}

// inRoom reports whether w's token was sent to the room (it may have left
// since), and waits, up to storeTimeout, for a late join still on the
// wire: a leave sent before it would miss the token.
func (s *Service) inRoom(w *waiter) bool {
	s.waits.mu.Lock()
	in, joining := w.inRoom, w.joining
	s.waits.mu.Unlock()
	if joining != nil {
		t := time.NewTimer(storeTimeout)
		defer t.Stop()
		select {
		case <-joining:
		case <-t.C:
		}
	}
	return in
}

// leaveBehind takes a waiter that gave up out of the line behind, if it
// waits there; caller holds the registry's mu.
func (kw *keyWaits) leaveBehind(w *waiter) {
	for i, b := range kw.behind {
		if b == w {
			kw.behind = append(kw.behind[:i:i], kw.behind[i+1:]...)
			return
		}
	}
}

// handOn gives w's token in the room, as w gives up, to the first waiter
// behind it that asked for a seat of the same shape (lease, capacity,
// weight, label: the room's slots entry says them), unless a seat may be
// on its way to w already or its late join is still on the wire. That
// waiter takes w's place in line and the seat it asked for. It reports
// whether it did: w then leaves without a call. Caller holds the
// registry's mu, and removes w in the same hold when it did not: a waiter
// behind that gives up at the same moment is then either gone before w
// looks (and skipped), or handed the token before it looks itself (and
// hands it on), never handed it between its own look and its removal,
// which would make it leave the room with a call.
func (r *waitRegistry) handOn(w *waiter) bool {
	wk := waitKey{w.req.key, w.token}
	kw := r.keys[w.req.key]
	if kw == nil || r.waiters[wk] != w || !w.inRoom || w.done || len(w.seat) > 0 || !joinEnded(w) {
		return false
	}
	b := kw.sameShapeBehind(w)
	if b == nil {
		return false
	}
	r.passToken(kw, w, b)
	return true
}

// passToken makes b, a waiter behind, take over w's token in the room, the
// seat it asked for and its place; w leaves, with b's permit id for a
// seat of its own. Caller holds mu.
func (r *waitRegistry) passToken(kw *keyWaits, w, b *waiter) {
	kw.leaveBehind(b)
	delete(r.waiters, waitKey{b.req.key, b.token})
	w.id, b.id = b.id, w.id
	w.member, b.member = b.member, w.member
	b.token, b.behind, b.inRoom, b.joined = w.token, false, true, w.joined
	r.waiters[waitKey{w.req.key, w.token}] = b
	w.done = true
	kw.n--
	kw.acquires--
}

// joinEnded reports whether w's late join, if it had one, returned.
func joinEnded(w *waiter) bool {
	if w.joining == nil {
		return true
	}
	select {
	case <-w.joining:
		return true
	default:
		return false
	}
}
