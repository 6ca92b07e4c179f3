package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// storeTimeout bounds one script call. Calls that change seats do not take
// the caller's cancellation: a call cut off on the wire could leave a seat
// taken that nobody knows about.
const storeTimeout = 5 * time.Second

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
		return s.acquire(ctx, key, permits, cfg)
	})
}

// TryAcquire makes one attempt: it returns (nil, nil) when key is full. It
// respects the fleet-wide line: a seat promised to an earlier waiter is not
// taken.
func (s *Service) TryAcquire(ctx context.Context, key string, permits int, opts ...AcquireOption) (*Permit, error) {
	cfg, err := s.acquireConfig(key, permits, opts)
	if err != nil {
		return nil, err
	}
	return s.observed(ctx, key, permits, func(ctx context.Context) (*Permit, int, error) {
		if s.isClosed() {
			return nil, 0, &AcquisitionError{Key: key, Reason: ReasonShutdown, Err: ErrClosed}
		}
		if err := ctx.Err(); err != nil {
			return nil, 0, &AcquisitionError{Key: key, Reason: ReasonCanceled, Err: err}
		}
		req := s.newRequest(key, permits, cfg)
		res, err := s.attempt(req, "", "", "", "")
		if err != nil {
			return nil, 1, &AcquisitionError{Key: key, Reason: ReasonError, Attempts: 1, Err: err}
		}
		if !res.granted {
			return nil, 1, nil
		}
		return s.grant(req, res), 1, nil
	})
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

// attemptResult is acquire.lua's reply.
type attemptResult struct {
	permitID  string
	member    string // the permit's member of holders
	granted   bool
	now       time.Time // server time
	released  int       // 1 held, 0 lost, -1 no release asked
	earliest  time.Time // soonest lease expiry when not granted; zero if none
	other     int64     // ticket of the first other entry in line, 0 if none
	nowMicros int64
	token     string    // first parked token, when a held seat was handed over
	free      int64     // seats still free after the call
	sent      time.Time // local time the call was sent
}

// attempt runs acquire.lua once. entry is the waiting-line entry ("" for a
// one-shot try), ticket and next the head's and the following waiter's
// tickets, release the member of a seat of ours to hand over.
func (s *Service) attempt(req request, entry, ticket, next, release string) (attemptResult, error) {
	res := attemptResult{permitID: randomID(), sent: time.Now()}
	res.member = member(res.permitID, req.cfg.holder)
	k := req.k
	args := []any{res.member, req.cfg.ttl.Milliseconds(), req.capacity,
		entry, lineEntryTTL.Milliseconds(), s.wakePrefix(), req.key, ticket, next, release}
	if release != "" {
		args = append(args, s.wakeFlag())
	}
	for len(args) > 7 && args[len(args)-1] == "" {
		args = args[:len(args)-1] // the script reads absent optional arguments as ''
	}
	vals, err := s.batch.of(k.holders).run(acquireScript, []string{k.holders, k.queue, k.qexp, k.parked}, args...).Slice()
	if err != nil {
		return res, err
	}
	var nums [7]int64
	if len(vals) != len(nums)+2 {
		return res, fmt.Errorf("semaphore: acquire script replied %d values", len(vals))
	}
	for i, v := range vals[:len(nums)] {
		if nums[i], err = replyInt(v); err != nil {
			return res, fmt.Errorf("semaphore: acquire script reply %d: %w", i, err)
		}
	}
	res.granted = nums[0] == 1
	res.now = time.UnixMilli(nums[1])
	res.released = int(nums[2])
	if nums[3] > 0 {
		res.earliest = time.UnixMilli(nums[3])
	}
	res.other = nums[4]
	res.nowMicros = nums[5]*1e6 + nums[6]
	res.token, _ = vals[7].(string)
	if res.free, err = replyInt(vals[8]); err != nil {
		return res, fmt.Errorf("semaphore: acquire script reply 8: %w", err)
	}
	s.clock.observe(res.nowMicros, res.sent, time.Now())
	return res, nil
}

// replyInt reads an integer of a script reply: a Lua number, or a string
// of digits (tickets, which Lua would round; ZSET scores in the "%.17g"
// form Redis prints them in). An empty string is 0.
func replyInt(v any) (int64, error) {
	switch v := v.(type) {
	case int64:
		return v, nil
	case string:
		if v == "" {
			return 0, nil
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n, nil
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, err
		}
		return int64(f), nil
	default:
		return 0, fmt.Errorf("unexpected %T", v)
	}
}

// grant turns a granted attempt into a Permit.
func (s *Service) grant(req request, res attemptResult) *Permit {
	p := newPermit(s, req, res)
	if s.obs != nil {
		s.obs.ActiveChanged(req.key, 1)
	}
	if req.cfg.autoRenew {
		s.startRenew(p)
	}
	return p
}

// acquire is Acquire without the span: it returns the permit and the
// number of attempts made.
func (s *Service) acquire(ctx context.Context, key string, permits int, cfg acquireConfig) (*Permit, int, error) {
	fail := func(reason Reason, attempts int, err error) (*Permit, int, error) {
		return nil, attempts, &AcquisitionError{Key: key, Reason: reason, Attempts: attempts, Err: err}
	}
	if s.isClosed() {
		return fail(ReasonShutdown, 0, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fail(ReasonCanceled, 0, err)
	}
	var timeout <-chan time.Time
	if cfg.waitTimeout > 0 {
		t := time.NewTimer(cfg.waitTimeout)
		defer t.Stop()
		timeout = t.C
	}
	req := s.newRequest(key, permits, cfg)

	w := &waiter{req: req, done: make(chan struct{})}
	l, direct := s.arrive(ctx, key)
	if direct != nil {
		// Nobody of ours is in line: ask the store directly, joining the
		// fleet-wide line if the semaphore is full.
		res, err := s.attempt(req, s.id, "", "", "")
		if err != nil || res.granted || cfg.maxAttempts == 1 {
			direct(false)
		}
		switch {
		case err != nil:
			return fail(ReasonError, 1, err)
		case res.granted:
			return s.grant(req, res), 1, nil
		case cfg.maxAttempts == 1:
			s.leaveLine(req)
			return fail(ReasonExhausted, 1, nil)
		}
		w.ticket, w.attempts = res.nowMicros, 1
		l.join(w)
		w.line.noteOther(res.other)
		direct(true)
	} else {
		w.ticket, _ = s.clock.now()
		l.join(w)
	}

	select {
	case <-w.done:
	case <-ctx.Done():
		w.line.abandon(w, ReasonCanceled, ctx.Err())
	case <-timeout:
		w.line.abandon(w, ReasonTimeout, errTimeout)
	case <-s.closed:
		w.line.abandon(w, ReasonShutdown, errShutdown)
	}
	<-w.done
	if w.err != nil {
		return nil, w.attempts, w.err
	}
	if w.handed {
		s.adopt(w.permit, cfg)
	}
	return w.permit, w.attempts, nil
}

// leaveLine takes this Service's entry out of key's fleet-wide line.
func (s *Service) leaveLine(req request) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	k := req.k
	err := leaveScript.Run(ctx, s.rdb, []string{k.holders, k.queue, k.qexp}, s.id, req.capacity, s.wakePrefix(), req.key).Err()
	if err != nil {
		s.log.Warn("semaphore: leave the waiting line (the entry lapses by itself)", "key", req.key, "err", err)
	}
}
