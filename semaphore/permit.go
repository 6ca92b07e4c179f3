package semaphore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Permit is a leased seat of a semaphore. Release it when the work is done;
// it lapses by itself at ExpiresAt unless extended or auto-renewed.
type Permit struct {
	s         *Service
	key       string
	k         keys
	id        string
	member    string // its member of the holders ZSET
	fence     uint64 // its fencing token (see Fence)
	capacity  int
	cfg       acquireConfig
	from      *spareBlock   // the spare seats it was lent from; nil for its own seat
	unfollow  func() bool   // a lent seat until it goes back: ends its loss with the spare seats' (see lendSpare; guarded by their mu)
	pending   *pendingFence // a seat handed over in memory, until its move answers (handover.go)
	fenceOnce sync.Once     // draws the fence of a lent seat, or waits for a handed-over one's

	mu          sync.Mutex
	acquiredAt  time.Time // server time
	ttl         time.Duration
	expiresAt   time.Time // server time
	deadline    time.Time // local clock: when the lease surely ran out if not renewed
	released    bool
	handedOff   bool // its seat went to a waiter in memory (handover.go)
	moved       bool // a seat handed to it in memory moved to it on the store
	isLost      bool
	lostOnce    sync.Once
	lost        context.Context // done once the seat is known lost
	markedLost  context.CancelFunc
	counted     bool               // still counted as active by the Observer
	renewTimer  *time.Timer        // the next renewal; nil when auto-renew is off
	renewCancel context.CancelFunc // cancels the renewal on the wire; nil when none is
	renewDone   chan struct{}      // closed when the renewal on the wire ends
}

// newPermit is the permit of the seat member of req with its fence, taken
// at server time now; the lease surely started no earlier than local time
// from.
func (s *Service) newPermit(req request, id, member string, fence uint64, now, from time.Time) *Permit {
	lost, markedLost := context.WithCancel(context.Background())
	return &Permit{
		s:          s,
		key:        req.key,
		k:          req.k,
		id:         id,
		member:     member,
		fence:      fence,
		capacity:   req.capacity,
		cfg:        req.cfg,
		acquiredAt: now,
		ttl:        req.cfg.ttl,
		expiresAt:  now.Add(req.cfg.ttl),
		deadline:   from.Add(req.cfg.ttl),
		lost:       lost,
		markedLost: markedLost,
	}
}

// started counts p as active and starts its auto-renewal, if asked for.
func (s *Service) started(p *Permit) {
	p.mu.Lock()
	p.counted = true
	p.mu.Unlock()
	if s.obs != nil {
		s.obs.ActiveChanged(p.key, 1)
	}
	if p.cfg.autoRenew && p.from == nil {
		s.startRenew(p) // a lent seat renews with its spare seats
	}
}

// Key is the semaphore's key.
func (p *Permit) Key() string { return p.key }

// ID is the permit's unique ID.
func (p *Permit) ID() string { return p.id }

// Fence is the permit's fencing token: greater than that of every seat
// granted on its key before it, across the fleet and across idle spells
// (SPEC §1.3). A resource that records the highest fence it has seen and
// refuses a write with a lower one is safe from a holder whose lease
// lapsed (a paused process) after its seat went to someone else.
//
// A seat lent from a process's spare seats (see Options.SpareSeats) draws
// its fence on the first call, a round trip; when its spare seats are
// gone or the store cannot be reached, that fence is 0 (logged), which a
// resource that has seen any fence refuses. A seat handed over in memory
// by a holder of this process (handover.go) waits for its move, a round
// trip that is usually over.
func (p *Permit) Fence() uint64 {
	switch {
	case p.from != nil:
		p.fenceOnce.Do(func() { p.fence = p.s.drawFence(p) })
	case p.pending != nil:
		p.awaitMove()
	}
	return p.fence
}

// Weight is how many seats the permit holds (WithWeight; 1 by default).
func (p *Permit) Weight() int { return p.cfg.seats }

// weight is how many seats p holds in Redis now: spare seats shrink as
// they go back (setWeight).
func (p *Permit) weight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.seats
}

func (p *Permit) setWeight(n int) {
	p.mu.Lock()
	p.cfg.seats = n
	p.mu.Unlock()
}

// TTL is the length of the current lease.
func (p *Permit) TTL() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ttl
}

// AcquiredAt is when the seat was taken, by the Redis server's clock.
func (p *Permit) AcquiredAt() time.Time {
	p.awaitMove()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.acquiredAt
}

// ExpiresAt is when the lease runs out unless extended, by the Redis
// server's clock.
func (p *Permit) ExpiresAt() time.Time {
	if p.from != nil {
		return p.from.permit.ExpiresAt()
	}
	p.awaitMove()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.expiresAt
}

// Lost is closed when the permit learns that its seat is gone: an
// auto-renewal or Extend found it expired or force-released, or renewal
// could not reach the store until shortly before the lease could run out
// (see lostMargin).
func (p *Permit) Lost() <-chan struct{} { return p.lost.Done() }

// AfterLost arranges for f to run in its own goroutine once the permit is
// lost (when Lost is closed), at once if it already is. Calling stop undoes
// that; it reports whether it did (false once f has been started). Unlike a
// goroutine waiting on Lost, it costs nothing while the seat is held.
func (p *Permit) AfterLost(f func()) (stop func() bool) {
	return context.AfterFunc(p.lost, f)
}

// Release gives the seat back. It is idempotent: a second call does nothing
// and returns nil. It returns ErrPermitNotHeld when the seat was already
// lost (expired or force-released): the cap was not held for the whole run.
// When the store cannot be reached the error says so and Release may be
// called again.
func (p *Permit) Release(ctx context.Context) error {
	p.mu.Lock()
	if p.released {
		p.mu.Unlock()
		return nil
	}
	p.released = true
	p.mu.Unlock()
	p.StopAutoRenew()

	held, err := p.s.release(ctx, p)
	if err != nil {
		p.mu.Lock()
		p.released = false
		p.mu.Unlock()
		return fmt.Errorf("semaphore: release %q: %w", p.key, err)
	}
	p.mu.Lock()
	counted := p.counted
	p.counted = false
	p.mu.Unlock()
	if obs := p.s.obs; obs != nil {
		obs.Release(ReleaseEvent{Key: p.key, Held: time.Since(p.localAcquired()), Lost: !held})
		if counted {
			obs.ActiveChanged(p.key, -1)
		}
	}
	if !held {
		return fmt.Errorf("semaphore: release %q permit %s: %w", p.key, p.id, ErrPermitNotHeld)
	}
	return nil
}

// release frees p's seat on the store, decides "held" by the store's
// clock, and passes the seat on to the first waiter (see release.lua). It
// reports whether p still held the seat.
func (s *Service) release(ctx context.Context, p *Permit) (bool, error) {
	if p.from != nil {
		return s.returnSpare(ctx, p)
	}
	p.awaitMove()
	if held, done, err := s.quickGive(p); done {
		return held, err
	}
	if held, done, err := s.handOver(p); done {
		return held, err
	}
	return s.releaseOnStore(p)
}

// releaseOnStore gives p's seat back with release.lua, which passes the
// free seats on. It reports whether p still held the seat.
func (s *Service) releaseOnStore(p *Permit) (bool, error) {
	args := s.settleArgs(p.key, "member", p.member, "seats", p.cfg.seats, "capacity", p.capacity)
	if s.wantsHead(p.key) {
		args = append(args, "head", "1")
	}
	if s.roomy.Recent(p.key) {
		args = append(args, "busy", "1") // tokens wait in its room: release.lua need not ask
	}
	if s.noLapse(p) {
		args = append(args, "nolapse", "1") // release.lua need not drop lapsed leases first
	}
	args = append(args, s.handingArgs(p.key, "")...)
	if r := p.cfg.room; r != nil && s.allStartOnSeat(p.key) {
		// Its waiters here start as their seat comes: their places go on
		// with their seats, by the settings of the room it entered.
		args = append(append(args, "settleown", "1"), r.args()...)
		if p.cfg.share != "" {
			args = append(args, "fair", "1")
		} else if req := p.request(); s.enrols(req) {
			args = append(args, enrolArgs(req)...)
		}
	}
	rep, err := s.runBatched(releaseScript, p.k, args...)
	if err != nil {
		return false, err
	}
	held, err := rep.int("held")
	if err != nil {
		return false, err
	}
	s.enrolled(p.request(), rep)
	s.passOn(p.key, rep, time.Time{})
	return held == 1, nil
}

// request is the request p's seat was given for.
func (p *Permit) request() request {
	return request{key: p.key, k: p.k, capacity: p.capacity, cfg: p.cfg}
}

// localDeadline is when the lease surely ran out, by the local clock,
// unless it was renewed.
func (p *Permit) localDeadline() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deadline
}

// noLapse reports whether no lease of p's key lapsed, p's included: p's
// lease has more than half its TTL to run, by the local clock, and this
// process rechecks the key at a lease expiry still to come (see
// earliestArmed).
func (s *Service) noLapse(p *Permit) bool { return p.surelyLive() && s.earliestArmed(p.key) }

// surelyLive reports whether the lease has more than half its TTL to run,
// by the local clock: a release sent now finds it live.
func (p *Permit) surelyLive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Until(p.deadline) > p.ttl/2
}

// localAcquired estimates the local time of acquisition.
func (p *Permit) localAcquired() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deadline.Add(-p.ttl)
}

// Extend pushes the lease expiry to now + ttl (server time). It returns an
// error wrapping ErrExtension when the seat is gone on the store.
func (p *Permit) Extend(ctx context.Context, ttl time.Duration) error {
	if err := checkTTL("Extend", ttl); err != nil {
		return err
	}
	if p.from != nil {
		return p.from.permit.Extend(ctx, ttl) // a lent seat lives with its spare seats
	}
	p.awaitMove()
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	vals, err := extendScript.Run(ctx, p.s.rdb, []string{p.k.holders}, p.member, ttl.Milliseconds(), p.weight()).Int64Slice()
	if err != nil {
		return fmt.Errorf("semaphore: extend %q: %w", p.key, err)
	}
	if len(vals) != 2 {
		return fmt.Errorf("semaphore: extend script replied %d values", len(vals))
	}
	if vals[0] != 1 {
		p.mu.Lock()
		released := p.released
		p.mu.Unlock()
		if !released {
			p.markLost()
		}
		return fmt.Errorf("semaphore: extend %q permit %s: %w", p.key, p.id, ErrExtension)
	}
	p.mu.Lock()
	p.ttl = ttl
	p.expiresAt = time.UnixMilli(vals[1]).Add(ttl)
	p.deadline = sent.Add(ttl)
	p.mu.Unlock()
	return nil
}

// IsHeld checks against the store whether the seat is still held.
func (p *Permit) IsHeld(ctx context.Context) (bool, error) {
	p.awaitMove()
	n, err := heldScript.Run(ctx, p.s.rdb, []string{p.k.holders}, p.member).Int()
	if err != nil {
		return false, fmt.Errorf("semaphore: is held %q: %w", p.key, err)
	}
	return n == 1, nil
}

// markLost closes Lost once and tells the Observer.
func (p *Permit) markLost() {
	p.lostOnce.Do(func() {
		// Renewal ends with the seat: stop it before anyone sees Lost. A
		// renewal on the wire (the caller, when it found the seat gone)
		// ends by itself.
		p.mu.Lock()
		p.isLost = true
		timer := p.renewTimer
		p.renewTimer = nil
		counted := p.counted
		p.counted = false
		p.mu.Unlock()
		if timer != nil {
			timer.Stop()
			p.s.forgetRenewal(p)
		}
		p.markedLost()
		p.s.log.Warn("semaphore: seat lost", "key", p.key, "permit", p.id)
		if obs := p.s.obs; obs != nil {
			obs.Lost(p.key)
			if counted {
				obs.ActiveChanged(p.key, -1)
			}
		}
	})
}

// lostMargin is how long before a lease could run out on the store an
// unrenewed permit counts as lost: a tenth of its TTL, at least 50 ms, at
// most a third of it. The partition test measured a holder overrunning by
// about 20 ms when the loss was declared at the last moment.
func lostMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/10, 50*time.Millisecond), ttl/3)
}

// IsAutoRenewing reports whether auto-renewal is running.
func (p *Permit) IsAutoRenewing() bool {
	if p.from != nil {
		return p.from.permit.IsAutoRenewing()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.renewTimer != nil
}

// StopAutoRenew stops auto-renewal and waits for a renewal on the wire to
// end; the lease then runs out at ExpiresAt unless extended or released.
func (p *Permit) StopAutoRenew() {
	p.s.forgetRenewal(p)
	p.stopRenew()
}

func (p *Permit) stopRenew() {
	p.mu.Lock()
	timer, cancel, done := p.renewTimer, p.renewCancel, p.renewDone
	p.renewTimer = nil
	p.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	if cancel != nil {
		cancel()
		<-done
	}
}

// startRenew starts p's auto-renewal, unless the Service is closed. A
// timer renews the lease about every TTL/3: no goroutine waits while the
// seat is held.
func (s *Service) startRenew(p *Permit) {
	s.mu.Lock()
	if s.isClosed() {
		s.mu.Unlock()
		return
	}
	s.renewing[p] = struct{}{}
	s.mu.Unlock()
	p.mu.Lock()
	// Close may have come between: it stops the renewals it finds, so
	// none may start after it.
	if !p.released && !p.isLost && p.renewTimer == nil && !s.isClosed() {
		p.renewTimer = time.AfterFunc(p.ttl/3, p.renewNow) // runs once p.mu is free
	}
	p.mu.Unlock()
}

// forgetRenewal drops p from the permits Close stops renewing.
func (s *Service) forgetRenewal(p *Permit) {
	s.mu.Lock()
	delete(s.renewing, p)
	s.mu.Unlock()
}

// renewNow is the renewal timer's work: extend the lease once, then set
// the timer for the next, unless renewal was stopped meanwhile or ends
// here.
func (p *Permit) renewNow() {
	p.mu.Lock()
	timer := p.renewTimer
	if timer == nil {
		p.mu.Unlock()
		return // stopped
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	p.renewCancel, p.renewDone = cancel, done
	// Give up a lost-margin before the lease could run out on the store,
	// so that the holder can stop its work before another process may take
	// the seat.
	giveUp := p.deadline.Add(-lostMargin(p.ttl))
	p.mu.Unlock()

	next, again := p.renewOnce(ctx, giveUp)
	cancel()
	p.mu.Lock()
	p.renewCancel, p.renewDone = nil, nil
	mine := p.renewTimer == timer
	if mine && again {
		timer.Reset(next)
	} else if mine {
		p.renewTimer = nil
	}
	p.mu.Unlock()
	close(done)
	if mine && !again {
		p.s.forgetRenewal(p)
	}
}

// renewOnce extends the lease; it says when to try next, or false when
// renewal ends (the seat is lost, or renewal was stopped).
func (p *Permit) renewOnce(ctx context.Context, giveUp time.Time) (time.Duration, bool) {
	callCtx, cancel := context.WithDeadline(ctx, giveUp)
	err := p.Extend(callCtx, p.TTL())
	cancel()
	switch {
	case err == nil:
		return p.TTL() / 3, true
	case errors.Is(err, ErrExtension):
		return 0, false // markLost already ran
	case ctx.Err() != nil:
		return 0, false
	case !time.Now().Before(giveUp):
		p.s.log.Warn("semaphore: could not renew the lease in time; the seat counts as lost", "key", p.key, "permit", p.id, "err", err)
		p.markLost()
		return 0, false
	default:
		p.s.log.Warn("semaphore: lease renewal failed; retrying", "key", p.key, "permit", p.id, "err", err)
		return min(p.TTL()/10, time.Until(giveUp)) + time.Millisecond, true
	}
}
