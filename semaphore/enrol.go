package semaphore

import (
	"context"
	"strings"
	"time"
)

// Enrolment. A call that gives up the standby place of a task of this
// process that starts on its seat (WithStartOnSeat) lets the next parked
// token out in that place, for this process to bring its task to a slot:
// the release that gives the task its seat (release.lua), or the task's
// Settle when the seat came from another process (settle.lua). With
// Room.Enrol, the same call makes that token a waiter of this process, in
// its place in line (enrol in room.lua): its task then stands by without
// an enter of its own, one script call and five commands less a task of a
// full key. Until an Enter takes it up (adopt), the token waits here as an
// enrolled waiter: a seat sent to it waits in its channel, and the recheck
// loop names it like any waiter. When OnWake brings its task to its queue
// rather than to a slot here (Unenrol), the token is in transit again, as
// any token let out. One that no Enter takes up within enrolTimeout (its
// task was deleted, or its queue paused) leaves as a task standing by
// leaves, parked with its arrival, unless a task took it up meanwhile
// with a seat of its own (leave.lua's only); one given a seat first keeps
// it only enrolSeatGrace. A seat given to an enrolled token before the
// reply that enrolled it is handed on (another call's reply, or a
// message) is kept for it (keepEarly), with the tokens let out in its
// place, which come back as its task starts, as for any seat; an Enter of
// a token whose enrolment is leaving waits for the leave (awaitLeave), so
// that the two calls do not cross.

// enrolTimeout is how long an enrolled token waits for an Enter here: its
// task is usually in a slot within milliseconds (OnWake claims it once the
// task in whose place it was let out starts).
const enrolTimeout = 2 * time.Second

// enrolSeatGrace is how long an enrolled token given a seat before an
// Enter took it up keeps the seat for its task: a task OnWake brought to a
// slot here comes within milliseconds; one that went to another worker
// (no slot was free here) does not, and the seat goes on.
const enrolSeatGrace = 200 * time.Millisecond

// earlyFor is how long a seat sent to a token nobody here waits for is
// kept for a waiter enrolled since (Service.early); earlyMax bounds the
// seats kept.
const (
	earlyFor = 5 * time.Second
	earlyMax = 1000
)

// enrols reports whether a call that lets tokens out in the place of req's
// token enrols them (a release of its seat, or its Entry's Settle): req
// entered a room that enrols (Room.Enrol) as a task that starts on its
// seat, of one seat and no fair share, and this process stands by for its
// key and renewed its presence there lately, so that the waiting keys are
// there with their TTL, or made with one (see enrol in room.lua), and the
// seats given to the enrolled tokens find this process present. A key
// with Acquire waiters here hands seats over in memory (handover.go), and
// enrols nothing.
func (s *Service) enrols(req request) bool {
	c := req.cfg
	if c.room == nil || !c.room.Enrol || s.onWake == nil || !c.startsOnSeat || c.seats != 1 || c.share != "" || s.isClosed() {
		return false
	}
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	kw := s.waits.keys[req.key]
	return kw != nil && kw.looping && kw.acquires == 0 && !kw.presentAt.IsZero() && time.Since(kw.presentAt) < presenceTTL/3
}

// enrolArgs are the arguments that make a call for req enrol (with its
// capacity, which a release names anyway).
func enrolArgs(req request) []any {
	return []any{"enrol", "1", "enrolid", randomID(), "ttl", req.cfg.ttl.Milliseconds()}
}

// enrolled registers the waiters a call for from enrolled (its reply's
// "enrolled": token, permit id, seat member, arrival, ...), before the
// seats the reply gives are handed on, so that a seat sent to one of them
// finds it.
func (s *Service) enrolled(from request, rep reply) {
	e := rep.strings("enrolled")
	if s.beforeEnrol != nil && len(e) > 0 {
		s.beforeEnrol(e)
	}
	for i := 0; i+3 < len(e); i += 4 {
		req := from
		req.started = time.Now()
		_, req.cfg.holder, _ = strings.Cut(e[i+2], "\n")
		req.cfg.waitTimeout, req.cfg.maxAttempts = 0, 0 // the Entry's Wait sets them
		w := &waiter{req: req, token: e[i], id: e[i+1], member: e[i+2], seat: make(chan seatMsg, 1), failed: make(chan error, 1),
			enrolled: true, place: e[i+3]}
		w.expiry = time.AfterFunc(enrolTimeout, func() { s.unenrol(w) })
		if !s.addEnrolled(w) {
			// (Its token waits here already, or the Service closed: the
			// enrolment leaves unless a wait took the token up since.)
			w.expiry.Stop()
			w.enrolled, w.inRoom = false, true
			s.leaveEnrolled(w)
			continue
		}
		s.waitsHere(w)
	}
}

// addEnrolled registers w, unless the Service closed or its token waits
// here already, and hands it the seat sent to it before, if any.
func (s *Service) addEnrolled(w *waiter) bool {
	r := &s.waits
	wk := waitKey{w.req.key, w.token}
	r.mu.Lock()
	_, taken := r.waiters[wk]
	r.mu.Unlock()
	if taken || s.isClosed() {
		return false
	}
	s.add(w)
	r.mu.Lock()
	m, ok := s.early.Take(letOutKey(w.req.key, w.token))
	r.mu.Unlock()
	switch {
	case ok && m.member == w.member:
		s.deliver(w.req.key, w.token, m)
	case ok && m.settled:
		s.woke(w.req.key, m.later) // the seat was another's: nothing to wait for
	}
	return true
}

// keepEarly keeps seat, sent to key's token, which no waiter here waits
// for, a while (Service.early), for a waiter enrolled since: the reply
// that enrolled it may still be on its way. It reports whether it did. The
// tokens let out in the token's place with the seat (seatMsg.later) come
// back as its task starts. If no waiter takes the seat up (the enrolling
// reply was lost), they come back as any token let out whose task does
// not come: enrolled, it leaves after enrolTimeout and is let out again;
// else its place lapses after the room's Transit.
func (s *Service) keepEarly(key, token string, seat seatMsg) bool {
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	k := letOutKey(key, token)
	if w := r.waiters[waitKey{key, token}]; w != nil {
		return false // it waits here (for another seat), or got its seat: not early
	}
	if member, ok := s.seatedAlone.Take(k); ok && member == seat.member {
		return false // its task took the seat already (a recheck found it first)
	}
	return s.early.Note(k, seat)
}

// adopt takes up the enrolled waiter of token, for an Enter of key with
// permits and cfg: nil when there is none, or when the Enter asks for
// another seat than the waiter's (it then leaves, and the Enter enters as
// usual).
func (s *Service) adopt(key, token string, permits int, cfg acquireConfig) *waiter {
	w, done := s.takeEnrolled(key, token, nil)
	if w == nil {
		return nil
	}
	defer done()
	r := &s.waits
	r.mu.Lock()
	fits := sameSeat(w.req, permits, cfg)
	if fits {
		w.req.cfg, w.req.capacity, w.req.started = cfg, permits, time.Now()
	}
	r.mu.Unlock()
	if !fits {
		s.leaveEnrolled(w)
		return nil
	}
	return w
}

// sameSeat reports whether an Enter with permits and cfg asks for the seat
// an enrolled waiter of req waits for.
func sameSeat(req request, permits int, cfg acquireConfig) bool {
	c := req.cfg
	return permits == req.capacity && cfg.holder == c.holder && cfg.ttl == c.ttl && cfg.autoRenew == c.autoRenew &&
		cfg.seats == 1 && cfg.share == "" && cfg.startsOnSeat && cfg.room != nil && c.room != nil && *cfg.room == *c.room
}

// takeEnrolled returns the enrolled waiter of key's token, no longer
// enrolled (nobody else takes it up, nor does it time out), or nil (also
// when it is another than want, if want is not nil); until
// its caller calls done, an Enter of the token waits (awaitLeave), so
// that a leave of it (leave.lua) and an enter do not cross.
func (s *Service) takeEnrolled(key, token string, want *waiter) (w *waiter, done func()) {
	r := &s.waits
	wk := waitKey{key, token}
	r.mu.Lock()
	w = r.waiters[wk]
	if w == nil || !w.enrolled || (want != nil && w != want) {
		r.mu.Unlock()
		return nil, nil
	}
	w.enrolled = false
	ch := make(chan struct{})
	if r.leaving == nil {
		r.leaving = map[waitKey]chan struct{}{}
	}
	r.leaving[wk] = ch
	r.mu.Unlock()
	w.expiry.Stop()
	return w, func() {
		r.mu.Lock()
		if r.leaving[wk] == ch {
			delete(r.leaving, wk)
		}
		r.mu.Unlock()
		close(ch)
	}
}

// awaitLeave waits until no enrolled waiter of key's token is leaving.
func (s *Service) awaitLeave(ctx context.Context, key, token string) {
	r := &s.waits
	r.mu.Lock()
	ch := r.leaving[waitKey{key, token}]
	r.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// unenrol makes w leave unless an Enter took it up.
func (s *Service) unenrol(w *waiter) {
	if w, done := s.takeEnrolled(w.req.key, w.token, w); w != nil {
		defer done()
		s.leaveEnrolled(w)
	}
}

// dropEnrolled makes the enrolled waiter of key's token leave, if there
// is one: its task will not come for it (it is gone, or waits elsewhere).
// It reports whether there was one.
func (s *Service) dropEnrolled(key, token string) bool {
	w, done := s.takeEnrolled(key, token, nil)
	if w != nil {
		defer done()
		s.leaveEnrolled(w)
	}
	return w != nil
}

// Unenrol hands on token, let out of key's room, whose task OnWake found
// no slot for here, before it brings the task to its queue (for any
// worker): when a release here enrolled it (Room.Enrol), it waits no
// longer as this process's. One given its seat meanwhile gave its place on
// with it: its seat goes back, the token parks again with its arrival,
// first in line, and Unenrol reports true: its task should stay where it
// waits, to come back with the next seat or place (in its queue it would
// find neither). Any other is in transit again, its place waiting the
// room's Transit for its task, as for any token let out.
func (s *Service) Unenrol(key, token string) (parked bool) {
	if w, done := s.takeEnrolled(key, token, nil); w != nil {
		defer done()
		return s.leaveEnrolledAs(w, "transit")
	}
	return false
}

// unenrolAll makes every enrolled waiter leave (the Service closes).
func (s *Service) unenrolAll() {
	r := &s.waits
	r.mu.Lock()
	var left []*waiter
	for _, w := range r.waiters {
		if w.enrolled {
			w.enrolled = false
			left = append(left, w)
		}
	}
	r.mu.Unlock()
	for _, w := range left {
		w.expiry.Stop()
		s.leaveEnrolled(w)
	}
}

// leaveEnrolled takes w, which no Enter took up, out of the waiting: its
// token parks with its arrival, a seat given to it goes back, and the
// tokens let out in its place then are handed on.
func (s *Service) leaveEnrolled(w *waiter) { s.leaveEnrolledAs(w, "park") }

// leaveEnrolledAs is leaveEnrolled, with how as leave.lua's (park, or
// transit: see Unenrol). It reports whether the seat given to w went back
// (the token parked, unless a task took it up elsewhere).
func (s *Service) leaveEnrolledAs(w *waiter, how string) bool {
	returned := s.giveUp(w, how, "only", "1", "id", w.id, "arrival", w.place)
	if later, settled := s.settledWith(w); settled {
		s.woke(w.req.key, later)
	}
	return returned
}
