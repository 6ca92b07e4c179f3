package semaphore

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// Acquire takes a seat of key, a semaphore of permits seats, waiting for one
// when all are taken. It fails with *AcquisitionError: ReasonExhausted
// (WithMaxAttempts), ReasonTimeout (WithWaitTimeout), ReasonError (the store
// failed), ReasonShutdown (Close) or ReasonCanceled (ctx is done).
func (s *Service) Acquire(ctx context.Context, key string, permits int, opts ...AcquireOption) (*Permit, error) {
	cfg, err := s.acquireConfig(key, permits, opts)
	if err != nil {
		return nil, err
	}
	return s.observed(ctx, key, permits, func(ctx context.Context) (*Permit, int, error) {
		if err := s.usable(ctx, key); err != nil {
			return nil, 0, err
		}
		req := s.newRequest(key, permits, cfg)
		if p, done, err := s.quickTake(req, true); done {
			if err != nil {
				return nil, 1, &AcquisitionError{Key: key, Reason: ReasonError, Attempts: 1, Err: err}
			}
			return s.keepUnlessClosed(p, 1)
		}
		w := newWaiter(req, "w:"+randomID())
		if s.waitBehind(w) {
			return s.await(ctx, w, "drop")
		}
		s.add(w)
		// Its token was made just now: the room need not look for it.
		p, rep, err := s.ask(req, w, "join", "new", "1")
		switch {
		case err != nil:
			s.giveUp(w, "drop")
			return nil, 1, &AcquisitionError{Key: key, Reason: ReasonError, Attempts: 1, Err: err}
		case p != nil:
			s.remove(w)
			return s.keepUnlessClosed(p, 1)
		}
		s.waitsHere(w)
		s.setEarliest(key, rep)
		return s.await(ctx, w, "drop")
	})
}

// TryAcquire makes one attempt: it returns (nil, nil) when key is full. A
// seat that freed without a release (a lease ran out) goes to whoever waits
// first; a free seat is never refused.
func (s *Service) TryAcquire(ctx context.Context, key string, permits int, opts ...AcquireOption) (*Permit, error) {
	cfg, err := s.acquireConfig(key, permits, opts)
	if err != nil {
		return nil, err
	}
	return s.observed(ctx, key, permits, func(ctx context.Context) (*Permit, int, error) {
		if err := s.usable(ctx, key); err != nil {
			return nil, 0, err
		}
		req := s.newRequest(key, permits, cfg)
		p, done, err := s.quickTake(req, false)
		if !done {
			p, _, err = s.ask(req, newWaiter(req, ""), "try")
		}
		switch {
		case err != nil:
			return nil, 1, &AcquisitionError{Key: key, Reason: ReasonError, Attempts: 1, Err: err}
		case p == nil:
			return nil, 1, nil
		}
		return s.keepUnlessClosed(p, 1)
	})
}

// usable reports why a call may not start: the Service is closed, or ctx
// is done.
func (s *Service) usable(ctx context.Context, key string) error {
	if s.isClosed() {
		return &AcquisitionError{Key: key, Reason: ReasonShutdown, Err: ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return &AcquisitionError{Key: key, Reason: ReasonCanceled, Err: err}
	}
	return nil
}

// WithPermit acquires a seat of key, runs fn, and always releases the seat,
// also when fn fails or panics. A seat found lost at release is logged, not
// returned: the work already ran.
func (s *Service) WithPermit(ctx context.Context, key string, permits int, fn func(ctx context.Context) error, opts ...AcquireOption) (err error) {
	if fn == nil {
		return errors.New("semaphore: WithPermit: nil fn")
	}
	p, err := s.Acquire(ctx, key, permits, opts...)
	if err != nil {
		return err
	}
	defer func() {
		rerr := p.Release(context.WithoutCancel(ctx))
		switch {
		case errors.Is(rerr, ErrPermitNotHeld):
			s.log.Warn("semaphore: seat was lost before release: the cap was not held for the whole run; raise the TTL or use auto-renew",
				"key", key, "permit", p.ID(), "ttl", p.TTL())
		case rerr != nil && err == nil:
			err = rerr
		case rerr != nil:
			s.log.Error("semaphore: release after failed work", "key", key, "permit", p.ID(), "err", rerr)
		}
	}()
	return fn(ctx)
}

// observed wraps an acquisition in its span and its Observer event.
func (s *Service) observed(ctx context.Context, key string, permits int, do func(context.Context) (*Permit, int, error)) (*Permit, error) {
	start := time.Now()
	ctx, span := s.tracer.Start(ctx, "semaphore.acquire")
	recording := span.IsRecording() // attributes cost allocations: only for a real tracer
	if recording {
		span.SetAttributes(attribute.String("semaphore.key", key), attribute.Int("semaphore.capacity", permits))
	}
	p, attempts, err := do(ctx)
	outcome := OutcomeAcquired
	var aerr *AcquisitionError
	switch {
	case errors.Is(err, errStandingBy):
		outcome, err = OutcomeStandby, nil
	case errors.As(err, &aerr):
		outcome = Outcome(aerr.Reason)
		attempts = aerr.Attempts
	case err != nil:
		outcome = Outcome(ReasonError)
	case p == nil:
		outcome = OutcomeFull
	}
	if recording {
		span.SetAttributes(attribute.Int("semaphore.attempts", attempts), attribute.String("semaphore.outcome", string(outcome)))
	}
	if err != nil && recording {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	if s.obs != nil {
		s.obs.Acquire(AcquireEvent{Key: key, Capacity: permits, Outcome: outcome, Attempts: attempts, Wait: time.Since(start)})
	}
	return p, err
}

// errStandingBy is what an Enter's do hands observed when the task got a
// standby place: no seat yet, and no failure either (OutcomeStandby).
var errStandingBy = errors.New("semaphore: standing by")

// request is what one acquisition asks for.
type request struct {
	key      string
	k        keys
	capacity int
	cfg      acquireConfig
	started  time.Time
}

func (s *Service) newRequest(key string, permits int, cfg acquireConfig) request {
	return request{key: key, k: s.keysFor(key), capacity: permits, cfg: cfg, started: time.Now()}
}

// ask runs acquire.lua once for w's seat in mode (see its header), with
// extra arguments; a seat given at once comes back as its Permit. Seats it
// gave to other waiters of this Service, and tokens it let out of the
// room, are handed on.
func (s *Service) ask(req request, w *waiter, mode string, extra ...any) (*Permit, reply, error) {
	args := s.settleArgs(req.key, append([]any{"mode", mode, "capacity", req.capacity, "id", w.id, "label", req.cfg.holder,
		"ttl", req.cfg.ttl.Milliseconds(), "seats", req.cfg.seats, "token", w.token, "procttl", presenceTTL.Milliseconds()},
		append(req.cfg.lineArgs(), extra...)...)...)
	sent := time.Now()
	var rep reply
	var err error
	if mode == "enter" || mode == "reserve" {
		rep, err = s.runNamed(context.Background(), acquireScript, req.k, args...)
	} else {
		rep, err = s.runBatched(acquireScript, req.k, args...)
	}
	if err != nil {
		return nil, nil, err
	}
	now, err := rep.int("now")
	if err != nil {
		return nil, nil, err
	}
	s.clock.observeMillis(now, sent, time.Now())
	s.passOn(req.key, rep, time.UnixMilli(now))
	if rep.str("outcome") != "seat" {
		return nil, rep, nil
	}
	fence, err := rep.uint("fence")
	if err != nil {
		return nil, nil, err
	}
	return s.newPermit(req, w.id, w.member, fence, time.UnixMilli(now), sent), rep, nil
}

// setEarliest tells key's recheck loop the soonest lease expiry a call
// saw, so that a seat freed by an expiry is taken at once.
func (s *Service) setEarliest(key string, rep reply) {
	e, err := rep.int("earliest")
	if err != nil || e == 0 {
		return
	}
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	if kw := r.keys[key]; kw != nil {
		if at := time.UnixMilli(e); kw.earliest.IsZero() || at.Before(kw.earliest) {
			kw.earliest = at
			select {
			case kw.nudge <- struct{}{}:
			default:
			}
		}
	}
}

// await waits for w's seat, until it fails (a recheck found the store
// down, or its attempts ran out), its wait budget runs out, ctx is done
// or the Service closes. A wait that gives up leaves the room (how: see
// leave.lua).
func (s *Service) await(ctx context.Context, w *waiter, how string) (*Permit, int, error) {
	var timeout <-chan time.Time
	if d := w.req.cfg.waitTimeout; d > 0 {
		t := time.NewTimer(d - time.Since(w.req.started))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case m := <-w.seat:
		if m.rechecked && w.req.cfg.startsOnSeat {
			// The release that gave it may still hand it on: noted before
			// the waiter leaves the registry, for keepEarly to see one or
			// the other.
			s.seatedAlone.Note(letOutKey(w.req.key, w.token), m.member)
		}
		s.remove(w)
		return s.keepUnlessClosed(s.seated(w, m), s.attemptsOf(w))
	case <-w.failed:
		s.giveUp(w, how)
		return nil, s.attemptsOf(w), w.fail
	case <-ctx.Done():
		return nil, s.attemptsOf(w), s.abandon(w, how, ReasonCanceled, ctx.Err())
	case <-timeout:
		return nil, s.attemptsOf(w), s.abandon(w, how, ReasonTimeout, errTimeout)
	case <-s.closed:
		return nil, s.attemptsOf(w), s.abandon(w, how, ReasonShutdown, errShutdown)
	}
}

// seated is the Permit of the seat m given to w.
func (s *Service) seated(w *waiter, m seatMsg) *Permit {
	now := m.now
	if now.IsZero() {
		now = time.Now()
	}
	// The lease started at the grant, by the server's clock: the local
	// deadline counts from the local time of that moment, as best known.
	at := time.Now()
	if local, known := s.clock.local(now); known && local.Before(at) {
		at = local
	}
	p := s.newPermit(w.req, w.id, m.member, m.fence, now, at)
	if m.pending != nil {
		p.pending = m.pending
		go p.resolveHandOver()
	}
	return p
}

// abandon ends w's wait for reason; a seat given to it meanwhile is given
// back.
func (s *Service) abandon(w *waiter, how string, reason Reason, cause error) error {
	s.giveUp(w, how)
	return &AcquisitionError{Key: w.req.key, Reason: reason, Attempts: s.attemptsOf(w), Err: cause}
}

// giveUp takes w out of the room (how: see leave.lua); a seat given to it
// meanwhile is given back in the same call, and giveUp reports whether
// one was.
func (s *Service) giveUp(w *waiter, how string, extra ...any) (returned bool) {
	s.waits.mu.Lock()
	if how == "drop" && s.waits.handOn(w) {
		s.waits.mu.Unlock()
		return false // a waiter behind it took its token (behind.go)
	}
	promote := s.waits.removeLocked(w)
	s.waits.mu.Unlock()
	s.removed(w, promote)
	if !s.inRoom(w) {
		return false // it waited behind: nothing of it is in the room
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	args := append([]any{"token", w.token, "member", w.member, "seats", w.req.cfg.seats, "how", how,
		"capacity", w.req.capacity, "keyttl", w.req.cfg.roomKeyTTL().Milliseconds()}, extra...)
	rep, err := s.runNamed(ctx, leaveScript, w.req.k, s.settleArgs(w.req.key, args...)...)
	if err != nil {
		s.log.Warn("semaphore: leave the waiting room (the entry lapses by itself)", "key", w.req.key, "err", err)
		return false
	}
	s.passOn(w.req.key, rep, time.Time{})
	n, _ := rep.int("returned")
	return n == 1
}

// keepUnlessClosed hands p to the caller, unless the Service was closed
// while the call was on the wire: then the seat is given back quietly and
// the caller gets ReasonShutdown.
func (s *Service) keepUnlessClosed(p *Permit, attempts int) (*Permit, int, error) {
	s.started(p)
	if s.isClosed() {
		s.giveBack(p)
		return nil, attempts, &AcquisitionError{Key: p.key, Reason: ReasonShutdown, Attempts: attempts, Err: errShutdown}
	}
	return p, attempts, nil
}

// giveBack releases a seat nobody will use.
func (s *Service) giveBack(p *Permit) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := p.Release(ctx); err != nil {
		s.log.Warn("semaphore: give back an unused seat (it lapses with its lease)", "key", p.key, "err", err)
	}
}
