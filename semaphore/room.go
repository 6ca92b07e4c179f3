package semaphore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The waiting room: waiting outside the process. A scheduler whose tasks
// wait for a seat in a queue rather than in a goroutine (the worker) gives
// each task a token. A task that finds no seat either holds one of the
// key's standby places, fleet-wide, and waits in its slot for the next seat
// (Entry.Wait), or goes to the room: its token is parked and the task goes
// back to its queue. Whenever a place frees (its task took a seat or gave
// up) or seats free with places to spare, the tokens that arrived first
// are let out, in the same script call, and handed to Options.OnWake,
// whose job is to bring their tasks to a slot, where they Enter again. A
// token keeps the place it first took, however often its task goes back,
// and leaves the room when its task takes a seat.

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
	// TTL is how long the room's keys outlive their last use.
	TTL time.Duration
	// Audit is how often, fleet-wide, one Admit call is handed the tokens
	// parked in the room to check (see Admit); 0: never.
	Audit time.Duration
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

// Entry is what Enter got.
type Entry struct {
	// Permit is the seat, when one was free.
	Permit *Permit
	// Standby reports a standby place: the task may Wait in its slot for
	// the next seat. Neither a permit nor a place: the token is parked and
	// the task should go back to its queue.
	Standby bool

	s          *Service
	key        string
	permits    int
	token      string
	arrival    int64 // the token's place, server µs
	holdsPlace bool  // the token holds a standby place until Settle
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
	return e.s.Dismiss(ctx, e.key, e.token)
}

// StepAside gives up the token's standby place, if it holds one, when its
// task goes back without starting (it waits for another key, or goes back
// to its queue): the place goes to the next token, and the token keeps its
// arrival for when it comes back (see Service.StepAside).
func (e *Entry) StepAside(ctx context.Context) error {
	if !e.holdsPlace {
		return nil
	}
	e.holdsPlace = false
	return e.s.StepAside(ctx, e.key, e.token)
}

// Enter asks for a seat of key (a semaphore of permits seats; 0 pauses
// it: no seat is given, nobody stands by) for the task of token, which is
// in a slot now: it takes a free seat unless waiters that came first stand
// in line, or a standby place while nobody waits in the room, or else
// parks the token. opts are those of the permit it may take (WithToken is
// implied).
func (s *Service) Enter(ctx context.Context, key string, permits int, token string, room Room, opts ...AcquireOption) (*Entry, error) {
	if err := s.checkRoomCall(key, permits, token, room); err != nil {
		return nil, err
	}
	cfg, err := s.acquireConfig(key, max(permits, 1), append(opts, WithToken(token)))
	if err != nil {
		return nil, err
	}
	e := &Entry{s: s, key: key, permits: permits, token: token}
	_, err = s.observed(ctx, key, permits, func(ctx context.Context) (*Permit, int, error) {
		if s.isClosed() {
			return nil, 0, &AcquisitionError{Key: key, Reason: ReasonShutdown, Err: ErrClosed}
		}
		req := s.newRequest(key, permits, cfg)
		req.capacity = permits // 0 when paused
		args := newAcquireArgs(req)
		outcome, res, err := s.enter(key, req.k, args, room, true)
		if err != nil {
			return nil, 1, &AcquisitionError{Key: key, Reason: ReasonError, Attempts: 1, Err: err}
		}
		e.arrival, e.Standby = res.ticket, outcome == 2
		e.holdsPlace = e.Standby || res.kept
		if e.Standby {
			return nil, 1, errStandingBy // not a failure: observed as OutcomeStandby
		}
		if outcome != 1 {
			return nil, 1, nil
		}
		e.Permit, _, err = s.keepUnlessClosed(req, res, 1)
		return e.Permit, 1, err
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Wait waits in line for the next seat, from the token's arrival, as
// Acquire does (opts as Acquire's; WithToken is implied). It is for an
// Entry with a standby place, which the token keeps: Settle it once the
// task starts; when Wait gives up, Park the token or Dismiss it (or the
// place lapses).
func (e *Entry) Wait(ctx context.Context, opts ...AcquireOption) (*Permit, error) {
	if !e.Standby {
		return nil, errors.New("semaphore: Entry.Wait without a standby place")
	}
	return e.s.acquireFrom(ctx, e.key, e.permits, e.arrival, append(opts, WithToken(e.token))...)
}

// Reserve asks for a standby place of key for a task that is not in a slot
// yet (a producer's new task): true when it got one and the task may go
// straight to its queue; false when the task should wait in the room:
// enqueue it where it is not dequeued, then Park its token.
func (s *Service) Reserve(ctx context.Context, key string, permits int, token string, room Room) (bool, error) {
	if err := s.checkRoomCall(key, permits, token, room); err != nil {
		return false, err
	}
	k := s.keysFor(key)
	outcome, _, err := s.enter(key, k, acquireArgs{member: "-", ttl: time.Millisecond, capacity: permits, token: token}, room, false)
	if err != nil {
		return false, fmt.Errorf("semaphore: reserve a place of %q: %w", key, err)
	}
	return outcome == 2, nil
}

// enter runs enter.lua: outcome 1 seat, 2 standby place, 0 none.
func (s *Service) enter(key string, k keys, a acquireArgs, room Room, inSlot bool) (int64, acquireReply, error) {
	r := acquireReply{member: a.member, sent: time.Now()}
	r.permitID, _ = splitMember(a.member)
	slot := "0"
	if inSlot {
		slot = "1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	vals, err := enterScript.Run(ctx, s.rdb, k.all(), a.member, a.ttl.Milliseconds(), a.capacity, a.token,
		room.Standby, room.Hold.Milliseconds(), room.Transit.Milliseconds(), room.TTL.Milliseconds(), slot, s.wakeFlag()).Slice()
	if err != nil {
		return 0, r, err
	}
	if len(vals) != 6 {
		return 0, r, fmt.Errorf("semaphore: enter script replied %d values", len(vals))
	}
	var outcome, nowMs, kept int64
	for i, dst := range []*int64{&outcome, &nowMs, &r.ticket, nil, &r.free, &kept} {
		if dst == nil {
			continue
		}
		if *dst, err = replyInt(vals[i]); err != nil {
			return 0, r, fmt.Errorf("semaphore: enter script reply %d: %w", i, err)
		}
	}
	r.granted, r.now, r.kept = outcome == 1, time.UnixMilli(nowMs), kept == 1
	s.woke(key, replyStrings(vals[3]))
	return outcome, r, nil
}

// Park puts the task of token in key's waiting room: it waits in its
// queue, not in a slot, until a place frees for it (a token that stood by
// goes back with its arrival). When a place is free now, the token is let
// out at once, to Options.OnWake like the others.
func (s *Service) Park(ctx context.Context, key string, permits int, token string, room Room) error {
	if err := s.checkRoomCall(key, permits, token, room); err != nil {
		return err
	}
	k := s.keysFor(key)
	vals, err := parkScript.Run(ctx, s.rdb, k.all(), permits, token, room.TTL.Milliseconds(), room.Standby, room.Transit.Milliseconds(), s.wakeFlag()).Slice()
	if err != nil {
		return fmt.Errorf("semaphore: park on %q: %w", key, err)
	}
	s.woke(key, replyStrings(vals))
	return nil
}

// Dismiss takes token out of key's waiting room for good (its task no
// longer waits, or cannot be found), and lets the next token out in its
// place.
func (s *Service) Dismiss(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	vals, err := dismissScript.Run(ctx, s.rdb, s.keysFor(key).all(), token, s.wakeFlag()).Slice()
	if err != nil {
		return fmt.Errorf("semaphore: dismiss from %q: %w", key, err)
	}
	s.woke(key, replyStrings(vals))
	return nil
}

// Admit lets tokens out of key's waiting room for places and seats that
// freed without a call that would have done it (a lease that ran out, a
// worker that died, a task that never showed up for its place), or that a
// new capacity or room opens. Call it now and then for the keys you know,
// and when their capacity changes. Once every room.Audit, fleet-wide, one
// call also returns the tokens parked in the room (the first 1000 by
// arrival): its caller checks that their tasks still wait and Dismisses
// the others, so that a task removed while it waited (deleted from its
// queue by an operator) leaves no token behind.
func (s *Service) Admit(ctx context.Context, key string, permits int, room Room) (audit []string, err error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if err := room.check(); err != nil {
		return nil, err
	}
	if permits < 0 {
		return nil, fmt.Errorf("semaphore: permits must be >= 0, got %d", permits)
	}
	vals, err := admitScript.Run(ctx, s.rdb, s.keysFor(key).all(), permits, room.Standby, room.Transit.Milliseconds(),
		room.TTL.Milliseconds(), s.wakeFlag(), room.Audit.Milliseconds(), auditMax).Slice()
	if err != nil {
		return nil, fmt.Errorf("semaphore: admit on %q: %w", key, err)
	}
	if len(vals) != 2 {
		return nil, fmt.Errorf("semaphore: admit script replied %d values", len(vals))
	}
	s.woke(key, replyStrings(vals[0]))
	return replyStrings(vals[1]), nil
}

// StepAside takes token out of key's waiting room for a while: its task
// waits elsewhere (for a seat of another key, or in a paused queue), so it
// gives up its place, which goes to the next token, but keeps its arrival
// (for an hour) for when it comes back: it then takes its old place in
// line.
func (s *Service) StepAside(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := checkToken(token); err != nil {
		return err
	}
	vals, err := asideScript.Run(ctx, s.rdb, s.keysFor(key).all(), token, s.wakeFlag()).Slice()
	if err != nil {
		return fmt.Errorf("semaphore: step aside from %q: %w", key, err)
	}
	s.woke(key, replyStrings(vals))
	return nil
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

// wakeFlag tells the scripts whether to let tokens out of a room: only a
// Service with OnWake does, so that others leave the rooms alone.
func (s *Service) wakeFlag() string {
	if s.onWake != nil {
		return "1"
	}
	return "0"
}

// woke hands the tokens a call let out of key's room to Options.OnWake.
func (s *Service) woke(key string, tokens []string) {
	if len(tokens) > 0 && s.onWake != nil {
		go s.onWake(key, tokens)
	}
}
