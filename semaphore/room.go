package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The waiting room: waiting outside the process. A scheduler whose tasks
// wait for a seat in a queue rather than in a goroutine (the worker) gives
// each task a token. A task that finds no seat either holds one of the
// key's standby places, fleet-wide, and waits in its slot for the next seat
// (Entry.Wait: the seat comes to it, as to a waiting Acquire), or goes to
// the room: its token is parked and the task goes back to its queue.
// Whenever a place frees (its task took a seat or gave up) or seats free
// with places to spare, the tokens that arrived first are let out, in the
// same script call, and handed to Options.OnWake, whose job is to bring
// their tasks to a slot, where they Enter again. A token keeps the place it
// first took, however often its task goes back, and leaves the room when
// its task takes a seat.

// Room tunes a key's waiting room.
type Room struct {
	// Standby is how many tasks may wait in a slot for the next seat at
	// once, fleet-wide; 0 lets tasks out of the room only for free seats.
	Standby int
	// Hold is how long a place held by a task in a slot lasts: its wait for
	// a seat, with a margin. A place lapses with a dead worker.
	Hold time.Duration
	// Transit is how long a place given to a task not in a slot yet (let
	// out of the room, or admitted by Reserve) waits for it to show up.
	Transit time.Duration
	// TTL is how long the room's keys outlive their last use; the keys of
	// the standby places and of the parked tokens, renewed with the room's
	// settings (four times a TTL while tasks enter, park or are swept), at
	// least three quarters of it.
	TTL time.Duration
	// Audit is how often, fleet-wide, one Admit call is handed the tokens
	// parked in the room to check (see Admit); 0: never. With it, one
	// Admit call every three quarters of it, fleet-wide, sweeps the room;
	// without it, every call does.
	Audit time.Duration
	// Enrol makes a release that gives a seat to a task of its process
	// standing by (WithStartOnSeat) also stand by, on that process's
	// behalf, the token it lets out in that task's place: the task of that
	// token, which OnWake brings to a slot, then stands by without a store
	// call of its own (enrol.go). Its seat is one, of the releasing seat's
	// lease, held under the token's text after its last NUL byte (a worker
	// gives its tasks' tokens that shape, and their seats that label); an
	// Enter for it with other options enters as usual.
	Enrol bool
}

// auditMax is the most parked tokens one audit is handed: the first by
// arrival, the ones whose turn comes next.
const auditMax = 1000

func (r Room) check() error {
	if r.Standby < 0 || r.Hold < time.Millisecond || r.Transit < time.Millisecond || r.TTL < time.Millisecond || r.Audit < 0 {
		return fmt.Errorf("semaphore: Room wants Standby >= 0, Hold, Transit and TTL of at least 1ms and Audit >= 0, got %+v", r)
	}
	return nil
}

// defaultRoomTTL is how long a waiting room's keys outlive a call when
// the caller did not say (the scripts' default too, defaultKeyTTL, see
// roomScript).
const defaultRoomTTL = 3 * time.Minute

// roomNote names key's room with the settings and capacity a call tells
// it, in s.told: a call of this Service that told them within an eighth of
// the room's TTL (roomTold) spares an enter of a token that holds a place,
// or a park behind others, telling them again (told '1'), as a room that
// holds tokens keeps its key, renewed four times a TTL by the calls that
// do tell it.
func roomNote(key string, capacity int, room Room) string {
	return key + "\x00" + strconv.Itoa(capacity) + "\x00" + strconv.Itoa(room.Standby) + "\x00" +
		room.Hold.String() + "\x00" + room.Transit.String() + "\x00" + room.TTL.String()
}

// roomTold reports whether a call of this Service told the room of note
// its settings within an eighth of room's TTL (see roomNote).
func (s *Service) roomTold(note string, room Room) bool { return s.told.Within(note, room.TTL/8) }

// args are the room's arguments of a script (see acquire.lua).
func (r Room) args() []any {
	return []any{"budget", r.Standby, "hold", r.Hold.Milliseconds(), "transit", r.Transit.Milliseconds(), "keyttl", r.TTL.Milliseconds()}
}

// Entry is what Enter got.
type Entry struct {
	// Permit is the seat, when one was free.
	Permit *Permit
	// Standby reports a standby place: the task may Wait in its slot for
	// the next seat. Neither a permit nor a place: the token is parked and
	// the task should go back to its queue.
	Standby    bool
	s          *Service
	w          *waiter
	key, token string
	holdsPlace bool   // the token holds a standby place until Settle or StepAside
	place      string // the arrival its place was made with (see placeMember in room.lua)
	// settled: the release that gave it its seat gave its place on too,
	// and let out the tokens of later, which Settle hands to OnWake
	settled bool
	later   []string
	room    Room    // the room it entered, whose settings Settle lets the next token out with
	seat    *Permit // the seat Wait got, whose Settle may enrol (enrol.go)
	fair    bool    // it entered with a share value (WithShare)
	// moving is the move of a seat handed to it in memory (handover.go),
	// which says whether its place went on, as settled does
	moving *pendingFence
}

// Settle gives up the token's standby place, if it holds one, once its
// task took its seat and starts: the place goes to the next token. A task
// keeps its place from its seat to its start, so that the slots holding a
// task that does not run never outnumber the places.
func (e *Entry) Settle(ctx context.Context) error {
	if !e.holdsPlace {
		return nil
	}
	e.holdsPlace = false
	e.awaitMoving()
	if e.settled {
		e.s.woke(e.key, e.later)
		return nil
	}
	extra := e.room.args()
	if e.place != "" {
		extra = append(extra, "place", e.place) // its place is not looked for
	}
	if e.fair {
		extra = append(extra, "fair", "1") // its note of a real arrival goes too
	}
	if e.seat != nil {
		if req := e.seat.request(); e.s.enrols(req) {
			extra = append(append(extra, enrolArgs(req)...), "capacity", req.capacity)
			return e.s.tokenCall(ctx, settleScript, "settle on", e.key, e.token, func(rep reply) { e.s.enrolled(req, rep) }, extra...)
		}
	}
	return e.s.tokenCall(ctx, settleScript, "settle on", e.key, e.token, nil, extra...)
}

// HoldsPlace reports whether the Entry's token still holds a standby place
// (until Settle, StepAside or Park): a seat taken at once holds none.
func (e *Entry) HoldsPlace() bool { return e.holdsPlace }

// StepAside gives up the token's standby place, if it holds one, when its
// task goes back without starting (it waits for another key, or goes back
// to its queue): the place goes to the next token, and the token keeps its
// arrival for when it comes back (see Service.StepAside).
func (e *Entry) StepAside(ctx context.Context) error {
	if !e.holdsPlace {
		return nil
	}
	e.holdsPlace = false
	e.awaitMoving()
	if e.settled {
		// Its place went on with its seat: nothing to give up, and no
		// arrival kept (see WithStartOnSeat).
		e.s.woke(e.key, e.later)
		return nil
	}
	return e.s.StepAside(ctx, e.key, e.token)
}

// awaitMoving waits, for a seat handed to the Entry in memory, until its
// move answered (up to storeTimeout): when the move gave its place on,
// the Entry is settled, with the tokens let out in it. (A move that did
// not answer leaves the place to Settle's call, which finds it gone if
// the move took it after all.)
func (e *Entry) awaitMoving() {
	pf := e.moving
	if pf == nil {
		return
	}
	e.moving = nil
	pf.wait()
	select {
	case <-pf.done:
		if pf.settled {
			e.settled, e.later = true, pf.later
		}
	default:
	}
	pf.mu.Lock()
	pf.settling = true
	if pf.placeGone {
		e.settled = true
	}
	e.later = append(e.later, pf.meanwhile...)
	pf.mu.Unlock()
}

// Enter asks for a seat of key (a semaphore of permits seats; 0 pauses
// it: no seat is given, nobody stands by) for the task of token, which is
// in a slot now: it takes a free seat unless tasks that came first wait in
// a slot, or a standby place while nobody waits in the room, or else
// parks the token. opts are those of the permit it may take (a weight
// above permits is an error unless the key is paused). A seat taken
// by a task that held a standby place keeps the place until Settle.
func (s *Service) Enter(ctx context.Context, key string, permits int, token string, room Room, opts ...AcquireOption) (*Entry, error) {
	if err := s.checkRoomCall(key, permits, token, room); err != nil {
		return nil, err
	}
	cfg, err := s.lineConfig(key, permits, opts)
	if err != nil {
		return nil, err
	}
	cfg.room = &room
	e := &Entry{s: s, key: key, token: token, fair: cfg.share != "", room: room}
	_, err = s.observed(ctx, key, permits, func(ctx context.Context) (*Permit, int, error) {
		if s.isClosed() {
			return nil, 0, &AcquisitionError{Key: key, Reason: ReasonShutdown, Err: ErrClosed}
		}
		s.awaitLeave(ctx, key, token)
		if w := s.adopt(key, token, permits, cfg); w != nil {
			// Its token waits already, enrolled by a release here.
			e.w, e.Standby, e.holdsPlace, e.place = w, true, true, w.place
			s.roomy.Mark(key)
			return nil, 1, errStandingBy
		}
		req := s.newRequest(key, permits, cfg)
		if p := s.lendSpare(req); p != nil {
			e.Permit, _, err = s.keepUnlessClosed(p, 1)
			return e.Permit, 1, err
		}
		want := s.spareWant(req)
		if want == 0 {
			if p, done, err := s.quickTake(req, true); done {
				if err != nil {
					return nil, 1, &AcquisitionError{Key: key, Reason: ReasonError, Attempts: 1, Err: err}
				}
				e.Permit, _, err = s.keepUnlessClosed(p, 1)
				return e.Permit, 1, err
			}
		}
		e.w = newWaiter(req, token)
		s.add(e.w)
		extra, spare := room.args(), ""
		if want > 0 {
			spare = member(randomID(), "spare:"+s.id)
			extra = append(extra, "spare", want, "sparemember", spare)
		}
		renew := !s.presenceFresh(key)
		if !renew {
			extra = append(extra, "presence", "0")
		}
		if s.earliestArmed(key) {
			extra = append(extra, "armed", "1")
		}
		if arrival, ok := s.letOut.Take(letOutKey(key, token)); ok {
			extra = append(extra, "placed", arrival)
		}
		note := roomNote(key, permits, room)
		told := s.roomTold(note, room)
		if told {
			extra = append(extra, "told", "1")
		}
		sent := time.Now()
		p, rep, err := s.ask(req, e.w, "enter", extra...)
		if err != nil {
			s.remove(e.w)
			return nil, 1, &AcquisitionError{Key: key, Reason: ReasonError, Attempts: 1, Err: err}
		}
		if n, _ := rep.int("spared"); n > 0 && p != nil {
			s.openSpare(req, spare, int(n), p)
		}
		e.Standby = rep.str("outcome") == "standby"
		e.place = rep.str("arrival")
		if e.Standby || rep.str("outcome") == "parked" {
			s.roomy.Mark(key)
		}
		e.holdsPlace = e.Standby
		if !e.Standby {
			s.remove(e.w)
		} else {
			s.waitsHere(e.w)
			if renew {
				s.presentSince(key, sent)
			}
			if !told {
				s.told.Mark(note)
			}
			s.setEarliest(key, rep)
			return nil, 1, errStandingBy // not a failure: observed as OutcomeStandby
		}
		if p == nil {
			return nil, 1, nil
		}
		kept, _ := rep.int("kept")
		e.holdsPlace = kept == 1
		e.Permit, _, err = s.keepUnlessClosed(p, 1)
		return e.Permit, 1, err
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Wait waits in the slot for the next seat, the seat coming to it first
// come first served, as to a waiting Acquire (opts as Acquire's: the wait
// budget is WithWaitTimeout). It is for an Entry with a standby place,
// which its seat keeps until Settle; when Wait gives up, the token goes
// back among the parked, keeping its arrival, and its place goes to the
// next.
func (e *Entry) Wait(ctx context.Context, opts ...AcquireOption) (*Permit, error) {
	if !e.Standby || e.w == nil {
		return nil, errors.New("semaphore: Entry.Wait without a standby place")
	}
	w := e.w
	e.w = nil
	// The waiter is registered: its recheck loop reads its request (see
	// rejoin, afterRecheck) under the registry's lock.
	e.s.waits.mu.Lock()
	for _, o := range opts {
		if o != nil {
			o(&w.req.cfg)
		}
	}
	err := w.req.cfg.err
	w.req.started = time.Now()
	w.standing, w.place = true, e.place
	e.s.waits.mu.Unlock()
	if err != nil {
		e.s.giveUp(w, "park")
		return nil, err
	}
	p, err := e.s.observed(ctx, w.req.key, w.req.capacity, func(ctx context.Context) (*Permit, int, error) {
		return e.s.await(ctx, w, "park")
	})
	if later, settled := e.s.settledWith(w); settled {
		if err != nil {
			e.s.woke(e.key, later) // the seat went back: nothing to wait for
		} else {
			e.settled, e.later = true, later
		}
	}
	if p != nil && p.pending != nil && p.pending.task {
		e.moving = p.pending // whether its place went on comes with the move
	}
	e.seat = p
	if err != nil {
		e.holdsPlace = false // parked: the place went on
	}
	return p, err
}

// Park gives up the Entry's standby place without waiting: the token goes
// back among the parked, keeping its arrival, and its place goes to the
// next (its task goes back to its queue).
func (e *Entry) Park(ctx context.Context) error {
	if !e.Standby || e.w == nil {
		return errors.New("semaphore: Entry.Park without a standby place")
	}
	w := e.w
	e.w, e.holdsPlace = nil, false
	e.s.giveUp(w, "park")
	return nil
}

// Reserve asks for a standby place of key for a task that is not in a slot
// yet (a producer's new task): true when it got one and the task may go
// straight to its queue; false when the task should wait in the room:
// enqueue it where it is not dequeued, then Park its token (a refused
// Reserve lets nobody out of the room and recalls no spare seats: the Park
// does). Of opts, WithShare places a new token on a fair key, and
// WithNewToken saves looking for a token that never waited.
func (s *Service) Reserve(ctx context.Context, key string, permits int, token string, room Room, opts ...AcquireOption) (bool, error) {
	if err := s.checkRoomCall(key, permits, token, room); err != nil {
		return false, err
	}
	cfg, err := s.lineConfig(key, permits, opts)
	if err != nil {
		return false, err
	}
	cfg.ttl = time.Millisecond
	req := s.newRequest(key, max(permits, 1), cfg)
	req.capacity = permits
	_, rep, err := s.ask(req, newWaiter(req, token), "reserve", room.args()...)
	if err != nil {
		return false, fmt.Errorf("semaphore: reserve a place of %q: %w", key, err)
	}
	return rep.str("outcome") == "standby", nil
}

// Park puts the task of token in key's waiting room: it waits in its
// queue, not in a slot, until a place frees for it (a token that stood by
// or stepped aside goes back with its arrival). When a place is free now,
// the token is let out at once, to Options.OnWake like the others. Of
// opts, WithShare places a new token on a fair key. It reports whether
// the token is first in line among the parked (nobody parked is ahead of
// it), as in a room that had nobody parked.
func (s *Service) Park(ctx context.Context, key string, permits int, token string, room Room, opts ...AcquireOption) (first bool, err error) {
	if err := s.checkRoomCall(key, permits, token, room); err != nil {
		return false, err
	}
	cfg, err := s.lineConfig(key, permits, opts)
	if err != nil {
		return false, err
	}
	args := append(room.args(), "token", token, "capacity", permits)
	note := roomNote(key, permits, room)
	told := s.roomTold(note, room)
	if told {
		args = append(args, "told", "1")
	}
	rep, err := s.runNamed(ctx, parkScript, s.keysFor(key), s.settleArgs(key, append(args, cfg.lineArgs()...)...)...)
	if err != nil {
		return false, fmt.Errorf("semaphore: park on %q: %w", key, err)
	}
	if !told {
		s.told.Mark(note)
	}
	s.passOn(key, rep, time.Time{})
	n, err := rep.int("first")
	if err != nil {
		return false, fmt.Errorf("semaphore: park on %q: %w", key, err)
	}
	return n == 1, nil
}

// Dismiss takes token out of key's waiting room for good (its task no
// longer waits, or cannot be found), and lets the next token out in its
// place.
func (s *Service) Dismiss(ctx context.Context, key, token string) error {
	s.dropEnrolled(key, token)
	return s.tokenCall(ctx, dismissScript, "dismiss from", key, token, nil)
}

// StepAside takes token out of key's waiting room for a while: its task
// waits elsewhere (for a seat of another key, or in a paused queue), so it
// gives up its place, which goes to the next token, but keeps its arrival
// (for an hour) for when it comes back: it then takes its old place in
// line.
func (s *Service) StepAside(ctx context.Context, key, token string) error {
	s.dropEnrolled(key, token)
	return s.tokenCall(ctx, asideScript, "step aside from", key, token, nil)
}

// StepAsideInTransit is StepAside for a token let out whose task did not
// come for its place: a worker holds the task and did not send it back
// (its handler is slow to, or the worker died). It leaves a token whose
// task came meanwhile (it waits in a process: its task stands by) or that
// holds no place as it is.
func (s *Service) StepAsideInTransit(ctx context.Context, key, token string) error {
	if s.dropEnrolled(key, token) {
		// It waited here, enrolled, for a task that did not come: parked
		// now, it steps aside.
		return s.tokenCall(ctx, asideScript, "step aside from", key, token, nil)
	}
	return s.tokenCall(ctx, asideScript, "step aside from", key, token, nil, "transit", "1")
}

// tokenCall runs a script about one token of key's room (dismiss.lua,
// aside.lua, settle.lua) and hands on what it passed on, after enrolled,
// if not nil, took the waiters it enrolled (enrol.go).
func (s *Service) tokenCall(ctx context.Context, script *redis.Script, what, key, token string, enrolled func(reply), extra ...any) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := checkToken(token); err != nil {
		return err
	}
	rep, err := s.runBatched(script, s.keysFor(key), s.settleArgs(key, append([]any{"token", token}, extra...)...)...)
	if err != nil {
		return fmt.Errorf("semaphore: %s %q: %w", what, key, err)
	}
	if enrolled != nil {
		enrolled(rep)
	}
	s.passOn(key, rep, time.Time{})
	return nil
}

// Admit lets tokens out of key's waiting room for places and seats that
// freed without a call that would have done it (a lease that ran out, a
// worker that died, a task that never showed up for its place), or that a
// new capacity or room opens. Call it now and then for the keys you know,
// and when their capacity changes (with a room.Audit of 0 then, so that
// the call is not skipped). With room.Audit, one call every three
// quarters of room.Audit, fleet-wide, does this, and the others return
// having done nothing: a fleet of many processes sweeps each room about
// once an interval, not once a process. Once every room.Audit, that call
// also returns the tokens parked in the room (the first 1000 by arrival):
// its caller checks that their tasks still wait and Dismisses the others,
// so that a task removed while it waited (deleted from its queue by an
// operator) leaves no token behind. elsewhere reports a call that found
// the room swept by another within three quarters of room.Audit and did
// nothing (its caller may leave the room to that sweeper for a while).
func (s *Service) Admit(ctx context.Context, key string, permits int, room Room) (audit []string, elsewhere bool, err error) {
	if err := checkKey(key); err != nil {
		return nil, false, err
	}
	if err := room.check(); err != nil {
		return nil, false, err
	}
	if permits < 0 {
		return nil, false, fmt.Errorf("semaphore: permits must be >= 0, got %d", permits)
	}
	rep, err := s.runNamed(ctx, admitScript, s.keysFor(key), s.settleArgs(key, append(room.args(),
		"capacity", permits, "audit", room.Audit.Milliseconds(), "auditmax", auditMax)...)...)
	if err != nil {
		return nil, false, fmt.Errorf("semaphore: admit on %q: %w", key, err)
	}
	s.passOn(key, rep, time.Time{})
	return rep.strings("audit"), rep.str("elsewhere") == "1", nil
}

func (s *Service) checkRoomCall(key string, permits int, token string, room Room) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if permits < 0 {
		return fmt.Errorf("semaphore: permits must be >= 0 (0 pauses the key), got %d", permits)
	}
	if err := checkToken(token); err != nil {
		return err
	}
	return room.check()
}

func checkToken(token string) error {
	if token == "" {
		return errors.New("semaphore: a waiting-room token must not be empty")
	}
	return nil
}
