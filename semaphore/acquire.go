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
	return s.acquireFrom(ctx, key, permits, 0, opts...)
}

// acquireFrom is Acquire for a waiter whose place in line is arrival
// (server µs) rather than now; 0 for now.
func (s *Service) acquireFrom(ctx context.Context, key string, permits int, arrival int64, opts ...AcquireOption) (*Permit, error) {
	cfg, err := s.acquireConfig(key, permits, opts)
	if err != nil {
		return nil, err
	}
	cfg.ticket = arrival
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
		res, err := s.callAcquire(req.k, key, newAcquireArgs(req))
		if err != nil {
			return nil, 1, &AcquisitionError{Key: key, Reason: ReasonError, Attempts: 1, Err: err}
		}
		if !res.granted {
			return nil, 1, nil
		}
		return s.keepUnlessClosed(req, res, 1)
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

// errStandingBy is what an Enter's do hands observed when the task got a
// standby place: no seat yet, and no failure either (OutcomeStandby).
var errStandingBy = errors.New("semaphore: standing by")

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

// acquireArgs is one call of acquire.lua (see its header).
type acquireArgs struct {
	member   string // the member to grant: permit id and holder label
	ttl      time.Duration
	capacity int
	// entry is this Service's entry in the fleet-wide line; "" for a
	// one-shot try that never queues.
	entry string
	// ticket is the place in line of the waiter asked for (server µs); 0
	// for now.
	ticket int64
	// nextTicket, after a grant, keeps the entry in line with the next
	// local waiter's place; 0 takes the entry out.
	nextTicket int64
	// release is the member of a seat of ours given back in the same
	// call (a hand-over through the store); "" for none.
	release string
	// token is the caller's token in the waiting room (WithToken).
	token string
}

// acquireReply is acquire.lua's answer.
type acquireReply struct {
	permitID string
	member   string // the permit's member of holders, as asked
	granted  bool
	now      time.Time // server time
	// released says what became of args.release: 1 it was held, 0 it
	// was already lost, -1 none was asked.
	released int
	// earliest is the soonest lease expiry when not granted; zero if
	// none.
	earliest time.Time
	// aheadTicket is the place of the first entry of another process in
	// the fleet-wide line; 0 if none.
	aheadTicket int64
	nowMicros   int64
	// tokens were let out of the waiting room by the call (and are
	// handed to Options.OnWake).
	tokens []string
	free   int64     // seats still free after the call
	ticket int64     // the waiter's place in line
	kept   bool      // enter.lua: a grant kept the token's standby place (see Entry.Settle)
	sent   time.Time // local time the call was sent
}

// newAcquireArgs asks for a seat for req under a new permit id.
func newAcquireArgs(req request) acquireArgs {
	return acquireArgs{member: member(randomID(), req.cfg.holder), ttl: req.cfg.ttl, capacity: req.capacity, token: req.cfg.token}
}

// callAcquire runs acquire.lua once.
func (s *Service) callAcquire(k keys, key string, a acquireArgs) (acquireReply, error) {
	r := acquireReply{member: a.member, sent: time.Now()}
	r.permitID, _ = splitMember(a.member)
	argv := []any{a.member, a.ttl.Milliseconds(), a.capacity,
		a.entry, lineEntryTTL.Milliseconds(), s.wakePrefix(), key, ticketArg(a.ticket), ticketArg(a.nextTicket), a.release,
		s.wakeFlag(), a.token}
	vals, err := s.batch.of(k.holders).run(acquireScript, k.all(), argv...).Slice()
	if err != nil {
		return r, err
	}
	var nums [7]int64
	if len(vals) != len(nums)+3 {
		return r, fmt.Errorf("semaphore: acquire script replied %d values", len(vals))
	}
	for i, v := range vals[:len(nums)] {
		if nums[i], err = replyInt(v); err != nil {
			return r, fmt.Errorf("semaphore: acquire script reply %d: %w", i, err)
		}
	}
	r.granted = nums[0] == 1
	r.now = time.UnixMilli(nums[1])
	r.released = int(nums[2])
	if nums[3] > 0 {
		r.earliest = time.UnixMilli(nums[3])
	}
	r.aheadTicket = nums[4]
	r.nowMicros = nums[5]*1e6 + nums[6]
	r.tokens = replyStrings(vals[7])
	s.woke(key, r.tokens)
	if r.free, err = replyInt(vals[8]); err != nil {
		return r, fmt.Errorf("semaphore: acquire script reply 8: %w", err)
	}
	if r.ticket, err = replyInt(vals[9]); err != nil {
		return r, fmt.Errorf("semaphore: acquire script reply 9: %w", err)
	}
	if r.ticket == 0 {
		r.ticket = r.nowMicros // the script leaves "now" for the caller to format
	}
	s.clock.observe(r.nowMicros, r.sent, time.Now())
	return r, nil
}

// ticketArg is a ticket as the scripts take it: "" for none.
func ticketArg(t int64) string {
	if t == 0 {
		return ""
	}
	return strconv.FormatInt(t, 10)
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

// replyStrings reads a list of strings of a script reply: a nested list,
// or the values themselves.
func replyStrings(v any) []string {
	list, ok := v.([]any)
	if !ok {
		return nil
	}
	out := make([]string, 0, len(list))
	for _, x := range list {
		if s, ok := x.(string); ok && s != "" {
			out = append(out, s)
		}
	}
	return out
}

// grant turns a granted attempt into a Permit.
func (s *Service) grant(req request, res acquireReply) *Permit {
	p := newPermit(s, req, res)
	if s.obs != nil {
		s.obs.ActiveChanged(req.key, 1)
	}
	if req.cfg.autoRenew {
		s.startRenew(p)
	}
	return p
}

// keepUnlessClosed turns a seat won by a call of the caller's own into its
// Permit, unless the Service was closed while the call was on the wire:
// then the seat is given back quietly and the caller gets ReasonShutdown.
func (s *Service) keepUnlessClosed(req request, res acquireReply, attempts int) (*Permit, int, error) {
	p := s.grant(req, res)
	if s.isClosed() {
		s.giveBack(p)
		return nil, attempts, &AcquisitionError{Key: req.key, Reason: ReasonShutdown, Attempts: attempts, Err: errShutdown}
	}
	return p, attempts, nil
}

// acquire is Acquire without the span: it returns the permit and the
// number of attempts made.
func (s *Service) acquire(ctx context.Context, key string, permits int, cfg acquireConfig) (*Permit, int, error) {
	if s.isClosed() {
		return nil, 0, &AcquisitionError{Key: key, Reason: ReasonShutdown, Err: ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, &AcquisitionError{Key: key, Reason: ReasonCanceled, Err: err}
	}
	req := s.newRequest(key, permits, cfg)
	l := s.useLine(key)
	defer s.doneWithLine(l)
	w := &waiter{req: req, done: make(chan struct{})}
	if p, attempts, err, settled := l.arrive(ctx, w); settled {
		return p, attempts, err
	}
	var timeout <-chan time.Time
	if cfg.waitTimeout > 0 {
		t := time.NewTimer(cfg.waitTimeout - time.Since(req.started))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		l.abandon(w, ReasonCanceled, ctx.Err())
	case <-timeout:
		l.abandon(w, ReasonTimeout, errTimeout)
	case <-s.closed:
		l.abandon(w, ReasonShutdown, errShutdown)
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

// leaveLine takes this Service's entry out of key's fleet-wide line; the
// script wakes whoever the entry held up from a free seat, counted with
// capacity.
func (s *Service) leaveLine(k keys, key string, capacity int) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	err := leaveScript.Run(ctx, s.rdb, []string{k.holders, k.queue, k.qexp}, s.id, capacity, s.wakePrefix(), key).Err()
	if err != nil {
		s.log.Warn("semaphore: leave the waiting line (the entry lapses by itself)", "key", key, "err", err)
	}
}
