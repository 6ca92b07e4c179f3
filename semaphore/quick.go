package semaphore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/lately"
)

// The quick path. Most calls find nobody waiting: a seat is free, or a
// seat is given back that nobody waits for. Such a call needs none of the
// waiting room. quick.lua takes a seat with the seats, the fence and one
// look at the room (about a third of the Redis time of acquire.lua, which
// defines the room's functions and reads its arguments by name); when it
// finds anybody waiting it changes nothing and says so, and the call goes
// through the room's script. A seat goes back with two plain commands
// (plainGive): S3's Redis CPU a cycle read 22 µs against 27 with
// quick.lua's give. A call that finds anybody waiting marks the key busy
// for busyFor, so that calls on a contended key go straight to the room's
// scripts instead of making two calls each. A take of the last seat marks
// it full for as long: the takes go to the room's script, which waits,
// and the gives stay quick, since they look for waiters themselves (a key
// whose cap is reached and nobody waits for, such as a tenant's cap of 2
// in S6, keeps the quick path).

var quickScript = redis.NewScript(luaFile("nextfence.lua") + luaFile("quick.lua"))

// busyFor is how long a key stays on the room's scripts after a call found
// somebody waiting for it, or found it full when it would have waited (and
// its takes after a take of its last seat); busyMax bounds the keys
// remembered.
const (
	busyFor = time.Second
	busyMax = 4096
)

func newBusyKeys() *lately.Marks { return &lately.Marks{For: busyFor, Max: busyMax} }

// quickFits reports whether req may take the quick path: one seat, on a
// key not busy lately, whose last seat no quick take took lately (the
// take would likely find it full).
func (s *Service) quickFits(req request) bool {
	return req.cfg.seats == 1 && !s.busy.Recent(req.key) && !s.full.Recent(req.key)
}

// quickTake takes a free seat for req when nobody waits for its key (the
// key is marked busy when it took the last seat). done
// is false when the call must go through acquire.lua (see above); else p
// is the seat, or nil when the key is full (a TryAcquire's answer: wait
// reports whether the caller would wait instead, which makes the key busy
// and done false).
func (s *Service) quickTake(req request, wait bool) (p *Permit, done bool, err error) {
	if !s.quickFits(req) {
		return nil, false, nil
	}
	id := randomID()
	m := member(id, req.cfg.holder)
	sent := time.Now()
	v, err := s.batch.of(req.k.holders).run(quickScript, req.k.quick(), "take", m, req.cfg.ttl.Milliseconds(), req.capacity).Slice()
	if err != nil {
		return nil, true, err
	}
	outcome, _ := v[0].(string)
	switch {
	case outcome == "seat" && len(v) == 4:
		now, fence, err := quickSeat(v)
		if err != nil {
			return nil, true, err
		}
		if free, _ := v[3].(int64); free == 0 {
			s.full.Mark(req.key) // it took the last seat: the next take will likely wait
		}
		s.clock.observeMillis(now, sent, time.Now())
		return s.newPermit(req, id, m, fence, time.UnixMilli(now), sent), true, nil
	case outcome == "full" && !wait:
		return nil, true, nil
	case outcome == "full" || outcome == "room":
		s.busy.Mark(req.key)
		return nil, false, nil
	}
	return nil, true, fmt.Errorf("semaphore: quick.lua replied %v", v)
}

// quickSeat reads the server time and the fence of a quick seat.
func quickSeat(v []any) (now int64, fence uint64, err error) {
	now, err = replyInt(v[1])
	if err != nil {
		return 0, 0, fmt.Errorf("semaphore: quick.lua's time: %w", err)
	}
	f, err := replyInt(v[2])
	if err != nil || f < 0 {
		return 0, 0, fmt.Errorf("semaphore: quick.lua's fence %v: %v", v[2], err)
	}
	return now, uint64(f), nil
}

// quickGive gives p's seat back on a key nobody was seen waiting for
// lately: no call of this Service found anybody waiting, and none of its
// callers waits for it now (a seat given back then may go to its own
// waiter in memory, handover.go). done is false when the call must go
// through release.lua with the seat still held. A key whose last seat a
// quick take took stays on the quick give: the give sees whether anybody
// waits.
//
// A seat whose lease is surely live (see Permit.surelyLive) goes back with
// two plain commands and no script: its ZREM, then a look at the room
// (EXISTS of its keys). The look comes after the seat is free, so that no
// waiter is missed: one that came before it is seen, one that came after
// found the seat free. When somebody waits, release.lua, given the seat
// already back, passes it on. The key's fence, which a script dropped with
// the last seat, lapses with the lease it was granted with (nextFence).
// Another seat asks quick.lua, which reads the clock to tell whether the
// lease ran out.
func (s *Service) quickGive(p *Permit) (held, done bool, err error) {
	if p.cfg.seats != 1 || s.busy.Recent(p.key) || s.hasWaiters(p.key) {
		return false, false, nil
	}
	if p.surelyLive() {
		return s.plainGive(p)
	}
	v, err := s.batch.of(p.k.holders).run(quickScript, p.k.quick(), "give", p.member).Slice()
	if err != nil {
		return false, true, err
	}
	switch outcome, _ := v[0].(string); outcome {
	case "held", "lost":
		return outcome == "held", true, nil
	case "room":
		s.busy.Mark(p.key)
		return false, false, nil
	}
	return false, true, fmt.Errorf("semaphore: quick.lua replied %v", v)
}

// plainGive gives back a seat whose lease is surely live with plain
// commands (see quickGive).
func (s *Service) plainGive(p *Permit) (held, done bool, err error) {
	var gone, waiting *redis.IntCmd
	s.batch.of(p.k.holders).runPlain(func(ctx context.Context, pipe redis.Pipeliner) {
		gone = pipe.ZRem(ctx, p.k.holders, p.member)
		waiting = pipe.Exists(ctx, p.k.waiting, p.k.parked, p.k.places, p.k.aside)
	})
	if err := gone.Err(); err != nil {
		return false, true, err
	}
	held = gone.Val() == 1
	if waiting.Err() == nil && waiting.Val() == 0 {
		return held, true, nil
	}
	// Somebody waits, or the look failed with the seat back: release.lua
	// looks again and passes the seat on (p's member is gone).
	s.busy.Mark(p.key)
	_, err = s.releaseOnStore(p)
	return held, true, err
}

// hasWaiters reports whether callers of this Service wait for key.
func (s *Service) hasWaiters(key string) bool {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	kw := s.waits.keys[key]
	return kw != nil && kw.n > 0
}
