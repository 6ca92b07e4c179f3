package semaphore

import (
	"context"
	"strconv"
	"sync"
	"time"
)

// Spare seats. Most caps are a safety bound that is rarely reached, and a
// task under such a cap should cost little beyond its queue's own calls.
// So when Enter takes an auto-renewed seat of a key that nobody waits for
// and whose seats are more than half free, it may take a few more with it
// (Options.SpareSeats at most, and never into the upper half of the key's
// seats): this Service's spare seats of the key, held in Redis under one
// member of weight n, labelled "spare:" and the Service's channel, and
// renewed like any permit. The next Enters of the key take a seat from
// them in memory, and their Release gives it back in memory: no round
// trip, until the spare seats run out.
//
// They come back to the key as soon as anybody finds it full: every call
// that does not get a seat (Acquire, TryAcquire, Enter, Reserve, Park, a
// step aside) tells each process that holds spare seats of the key, on its
// seat channel (recallSpares in room.lua). That process gives back at once
// the spare seats its tasks do not use and the others as they finish, and
// takes no more until a call of its own finds the key quiet again; the
// seats it gives back go to whoever waits, first come first served, in the
// same call. A Service takes spare seats only while its seat channel is
// confirmed, and gives back all it can when the channel is lost, so that
// it never holds spare seats it could not be asked for. Idle spare seats
// go back after spareIdle, and at Close.
//
// A seat lent from spare seats draws its fence when it is first asked for
// (Permit.Fence): a round trip, for the handlers that use one.

// spareMessage starts the message that recalls a key's spare seats; the
// key follows (recallSpares in room.lua).
const spareMessage = "spare:"

// spareIdle is how long spare seats that no task uses are kept.
const spareIdle = 250 * time.Millisecond

// spareSeats are the spare seats a Service holds, by key.
type spareSeats struct {
	max  int
	mu   sync.Mutex
	open map[string]*spareBlock // the spare seats each key lends from
}

// spareBlock is one key's spare seats.
type spareBlock struct {
	permit   *Permit // the seats in Redis, auto-renewed; its weight is how many
	capacity int     // the key's capacity they were taken under
	used     int     // seats lent out; guarded by spareSeats.mu
	lent     uint64  // seats lent so far, for their ids; guarded by spareSeats.mu
	draining bool    // lends no more: seats go back as they free
	idle     *time.Timer
	shrinkMu sync.Mutex // one give-back call at a time
}

// live reports whether b's seats surely still hold: not lost, and renewed
// lately enough that they cannot have lapsed on the store (a process that
// was paused past its lease lends nothing until a renewal says so).
func (b *spareBlock) live() bool {
	p := b.permit
	return !isDone(p.lost) && time.Now().Before(p.localDeadline().Add(-lostMargin(p.TTL())))
}

// spareWant is how many spare seats an Enter of req asks for with its
// seat: none when spares are off, when the seat is not auto-renewed or
// waits in a fair line, when the key's spare seats are open already, or
// when this Service's channel is not confirmed (it starts listening).
func (s *Service) spareWant(req request) int {
	if !s.spareFits(req) || req.capacity < 4 {
		return 0
	}
	s.spare.mu.Lock()
	_, open := s.spare.open[req.key]
	s.spare.mu.Unlock()
	if open || !s.listening() {
		return 0
	}
	return s.spare.max
}

// spareFits reports whether req's seat may come from spare seats: spares
// are on, and the seat is auto-renewed (as they are) and waits in no fair
// line.
func (s *Service) spareFits(req request) bool {
	return s.spare.max > 0 && req.cfg.autoRenew && req.cfg.share == ""
}

// lendSpare lends req a seat of its key's spare seats, or returns nil.
// req's key names (req.k) may be unset: the seat has the spare seats'.
func (s *Service) lendSpare(req request) *Permit {
	if !s.spareFits(req) {
		return nil
	}
	sp := &s.spare
	sp.mu.Lock()
	defer sp.mu.Unlock()
	b := sp.open[req.key]
	if b == nil {
		return nil
	}
	if b.capacity != req.capacity {
		// The capacity changed (an override): take no more under the old.
		s.drainLocked(req.key, b)
		return nil
	}
	if b.permit.weight()-b.used < req.cfg.seats || !b.live() {
		return nil
	}
	b.used += req.cfg.seats
	if b.idle != nil {
		b.idle.Stop()
		b.idle = nil
	}
	b.lent++
	// Its id: the spare seats' and a count (no random bytes to read).
	p := s.newPermit(req, b.permit.id+"."+strconv.FormatUint(b.lent, 10), b.permit.member, 0, time.Now(), time.Now())
	// It is lost with the spare seats, until it goes back (returnSpare
	// undoes the link: a context derived from theirs would stay in it, a
	// hundred bytes a task, as long as they are lent).
	p.unfollow = context.AfterFunc(b.permit.lost, p.markedLost)
	p.from = b
	return p
}

// openSpare keeps the spare seats an Enter took with its seat p.
func (s *Service) openSpare(req request, member string, n int, p *Permit) {
	cfg := req.cfg
	cfg.seats, cfg.holder = n, ""
	id, _ := splitMember(member)
	bp := s.newPermit(request{key: req.key, k: req.k, capacity: req.capacity, cfg: cfg}, id, member, 0, p.AcquiredAt(), p.localAcquired())
	b := &spareBlock{permit: bp, capacity: req.capacity}
	sp := &s.spare
	sp.mu.Lock()
	if old := sp.open[req.key]; old != nil {
		s.drainLocked(req.key, old)
	}
	sp.open[req.key] = b
	b.idle = time.AfterFunc(spareIdle, func() { s.idleSpare(req.key, b) })
	if s.isClosed() {
		s.drainLocked(req.key, b) // Close came while the call was on the wire
	}
	sp.mu.Unlock()
	s.startRenew(bp)
}

// returnSpare takes back p's seat, lent from spare seats. It reports
// whether the spare seats were still held. A Release retried after it
// failed (the spare seats could not shrink on the store) only retries the
// shrink: the seat was taken back the first time.
func (s *Service) returnSpare(ctx context.Context, p *Permit) (bool, error) {
	b := p.from
	sp := &s.spare
	sp.mu.Lock()
	if p.unfollow != nil { // the first return: a retry finds it nil
		p.unfollow()
		p.unfollow = nil
		b.used -= p.cfg.seats
	}
	lost := !b.live()
	if lost && sp.open[p.key] == b {
		s.drainLocked(p.key, b) // what is left goes back as it frees
	}
	keep, lending := b.used, !lost && !b.draining && sp.open[p.key] == b
	if lending && keep == 0 && b.idle == nil {
		b.idle = time.AfterFunc(spareIdle, func() { s.idleSpare(p.key, b) })
	}
	sp.mu.Unlock()
	if !lending {
		// What it held goes back, also when it may be lost: a renewal
		// that comes through later must not keep seats nobody uses.
		if err := s.shrinkSpare(ctx, b, keep); err != nil && !lost {
			return true, err
		}
	}
	return !lost, nil
}

// idleSpare gives back b's seats once no task has used them for
// spareIdle.
func (s *Service) idleSpare(key string, b *spareBlock) {
	sp := &s.spare
	sp.mu.Lock()
	if sp.open[key] != b || b.used > 0 {
		sp.mu.Unlock()
		return
	}
	s.drainLocked(key, b)
	sp.mu.Unlock()
}

// recallSpare is the message that key was found full: its spare seats go
// back.
func (s *Service) recallSpare(key string) {
	sp := &s.spare
	sp.mu.Lock()
	if b := sp.open[key]; b != nil {
		s.drainLocked(key, b)
	}
	sp.mu.Unlock()
}

// drainAllSpares gives back every key's unused spare seats: this
// Service's channel was lost, or it closes. With wait, it returns once
// they are back.
func (s *Service) drainAllSpares(wait bool) {
	sp := &s.spare
	sp.mu.Lock()
	var calls []func()
	for key, b := range sp.open {
		calls = append(calls, s.drainCall(key, b))
	}
	sp.mu.Unlock()
	var wg sync.WaitGroup
	for _, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			call()
		}()
	}
	if wait {
		wg.Wait()
	}
}

// drainLocked stops b lending and gives back its unused seats, in the
// background. Caller holds spare.mu.
func (s *Service) drainLocked(key string, b *spareBlock) {
	go s.drainCall(key, b)()
}

// drainCall stops b lending, and returns the call that gives back its
// unused seats. Caller holds spare.mu.
func (s *Service) drainCall(key string, b *spareBlock) func() {
	b.draining = true
	if b.idle != nil {
		b.idle.Stop()
		b.idle = nil
	}
	if s.spare.open[key] == b {
		delete(s.spare.open, key)
	}
	keep := b.used
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		defer cancel()
		if err := s.shrinkSpare(ctx, b, keep); err != nil {
			s.log.Warn("semaphore: give back spare seats (they lapse with their lease)", "key", key, "err", err)
		}
	}
}

// shrinkSpare gives back b's seats beyond keep; with keep 0, all of them,
// and b ends.
func (s *Service) shrinkSpare(ctx context.Context, b *spareBlock, keep int) error {
	b.shrinkMu.Lock()
	defer b.shrinkMu.Unlock()
	p := b.permit
	seats := p.weight()
	if keep >= seats {
		return nil
	}
	if keep == 0 {
		p.StopAutoRenew()
	}
	rep, err := s.runBatched(releaseScript, p.k, s.settleArgs(p.key, "member", p.member, "seats", seats, "keep", keep, "spare", "1", "capacity", p.capacity)...)
	if err != nil {
		return err
	}
	held, err := rep.int("held")
	if err != nil {
		return err
	}
	p.setWeight(keep)
	s.passOn(p.key, rep, time.Time{})
	if held == 0 && keep > 0 {
		// Gone on the store (force-released, or lapsed): the tasks on
		// them learn it now rather than at the next renewal.
		p.markLost()
	}
	return nil
}

// drawFence draws the fence of p, a seat lent from spare seats: 0 when
// the spare seats are gone, or the store cannot be reached (logged).
func (s *Service) drawFence(p *Permit) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	rep, err := s.runNamed(ctx, fenceScript, p.k, "member", p.member)
	if err == nil {
		var fence uint64
		if fence, err = rep.uint("fence"); err == nil {
			return fence
		}
	}
	s.log.Error("semaphore: draw the fence of a seat lent from spare seats; its fence is 0, which a resource that has seen one refuses", "key", p.key, "err", err)
	return 0
}

// isDone reports whether ctx is done.
func isDone(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	default:
		return false
	}
}
