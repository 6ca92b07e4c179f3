package semaphore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/lately"
)

// Waiting in a process. A waiter (a waiting Acquire, or a task standing by
// in a worker slot: Entry.Wait) is a token in its key's waiting room; the
// script call that frees a seat gives it to the first waiter and sends it
// the seat on the waiter's process's channel (its Service's id), or returns
// it when the caller is the waiter's own Service (passOn). A Service's
// waiters of one key share a recheck loop: the safety net that renews the
// process's presence in the room (a seat is never sent to a gone process),
// takes the seats that freed without a release (a lease ran out: timed by
// the soonest expiry), and asks again for the seats given while the
// subscription was down. Its backoff grows from backoffBase to backoffMax,
// or to heardBackoffMax while the subscription is heard.

const (
	backoffBase = 20 * time.Millisecond
	backoffMax  = time.Second
	// presenceTTL is how long a process's presence in a room outlives its
	// last recheck: a crashed process's waiters stop being given seats
	// after it.
	presenceTTL = 3 * time.Second
	// heardBackoffMax bounds the backoff while the subscription is heard
	// (seats come as messages): the rechecks, at most this far apart,
	// still renew the presence twice a presenceTTL.
	heardBackoffMax = presenceTTL / 2
)

// seatMsg is a seat given to a waiter: its member, and the server time of
// the grant (zero when unknown).
type seatMsg struct {
	member  string
	fence   uint64
	now     time.Time
	pending *pendingFence // a seat handed over in memory: its move is on the wire (handover.go)
	// settled: the release gave the waiter's standby place on too, and let
	// out the tokens of later in its place (see WithStartOnSeat)
	settled bool
	later   []string
	// rechecked: a recheck handed it on (see passOnFrom); the reply of
	// the call that gave it may still come
	rechecked bool
}

// waiter is one wait of this Service for a seat of key.
type waiter struct {
	req      request
	token    string
	id       string // the permit id of the seat it asked for
	member   string
	seat     chan seatMsg // holds the one seat given to it
	failed   chan error   // closed with fail set when the wait fails
	attempts int          // store calls made on its behalf; guarded by the registry's mu
	joined   bool         // its token is among the waiting (its first call said so); guarded by mu
	done     bool         // given a seat or gone: no second delivery; guarded by mu
	settled  bool         // its seat came with its place given on (seatMsg.settled); guarded by mu
	later    []string     // the tokens let out in its place then; guarded by mu
	fail     error
	// Waiting behind (behind.go), guarded by mu: behind while it waits in
	// this process only, with its arrival since (server µs); inRoom once
	// its token was sent to the room; joining is closed when a late join
	// returned.
	behind  bool
	since   int64
	inRoom  bool
	joining chan struct{}
	// Enrolled by a release of this Service, and no Enter took it up yet
	// (enrol.go), guarded by mu: its place's arrival, and when it leaves.
	enrolled bool
	place    string
	expiry   *time.Timer
	// standing: a task's Entry waits with it (Entry.Wait), so that a seat
	// may be handed to it in memory (handover.go); guarded by mu. place is
	// then the arrival its standby place was made with.
	standing bool
}

func newWaiter(req request, token string) *waiter {
	id := randomID()
	return &waiter{req: req, token: token, id: id, member: member(id, req.cfg.holder),
		seat: make(chan seatMsg, 1), failed: make(chan error, 1), attempts: 1}
}

// waitKey names a waiter in the registry.
type waitKey struct{ key, token string }

// keyWaits is what the registry keeps per key with waiters.
type keyWaits struct {
	n        int           // waiters
	looping  bool          // its recheck loop runs
	capacity int           // the capacity the last of them asked for
	nudge    chan struct{} // makes the recheck loop look now
	backoff  time.Duration // what the loop sleeps now (for tests)
	earliest time.Time     // the soonest lease expiry the last call saw, server time
	// missed: seats may have been sent to its waiters while the
	// subscription was not confirmed: its next recheck asks for them
	missed   bool
	joined   int       // its waiters whose tokens were sent to the room, still waiting
	behind   []*waiter // its waiters behind them, in arrival order (behind.go)
	acquires int       // its waiters that are Acquire calls (not tasks standing by)
	others   int       // its waiters that do not start as their seat comes (WithStartOnSeat)
	// The line's first waiting tokens, and whether no task waits in the
	// room, by the last reply that said, less those handed seats since
	// (handover.go).
	line  []string
	clear bool
	// next is the tokens first in line by the last reply that said so
	// (a release's or a hand-over's: see nextInLine in room.lua), less
	// those handed seats since, and nextAt when it came; a reply that
	// gives seats and does not say forgets them (noteNext).
	next   []string
	nextAt time.Time
	// handing names its tokens handed a seat in memory whose move is on
	// its way (handover.go)
	handing map[string]bool
	// presentAt is when the last call that renewed this process's
	// presence in the key's room was sent (see presenceFresh).
	presentAt time.Time
}

// presenceFresh reports whether this process renewed its presence in
// key's room lately (within a third of presenceTTL, by a recheck or an
// enter): an enter that stands by then leaves the presence alone, as the
// recheck loop, which runs while the key has waiters here, renews it
// well within presenceTTL.
func (s *Service) presenceFresh(key string) bool {
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	kw := r.keys[key]
	return kw != nil && !kw.presentAt.IsZero() && time.Since(kw.presentAt) < presenceTTL/3
}

// earliestArmed reports whether key's recheck loop here waits for a
// lease expiry still to come: an enter that stands by need not ask for
// the soonest one, nor drop lapsed leases (with one lease TTL on the key,
// none lapsed before that expiry). A lease granted since with an earlier expiry (a
// shorter lease TTL on the same key) that lapses is found by that
// recheck, or by the workers' sweep (admit.lua), whichever comes first.
func (s *Service) earliestArmed(key string) bool {
	now, known := s.clock.now()
	if !known {
		return false
	}
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	kw := r.keys[key]
	return kw != nil && kw.looping && !kw.earliest.IsZero() && kw.earliest.After(time.UnixMicro(now))
}

// presentSince notes that a call sent at sent renewed this process's
// presence in key's room.
func (s *Service) presentSince(key string, sent time.Time) {
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	if kw := r.keys[key]; kw != nil {
		kw.presentBy(sent)
	}
}

// presentBy notes that a call sent at sent renewed the presence (the
// registry's mu held).
func (kw *keyWaits) presentBy(sent time.Time) {
	if sent.After(kw.presentAt) {
		kw.presentAt = sent
	}
}

// waitRegistry holds a Service's waiters, its keys' recheck loops, and its
// subscription to its seat channel.
type waitRegistry struct {
	mu      sync.Mutex
	waiters map[waitKey]*waiter
	// leaving: the enrolled tokens whose leave is on its way (enrol.go)
	leaving map[waitKey]chan struct{}
	keys    map[string]*keyWaits
	// leftLine marks, for a while, the tasks standing by that left the
	// line (seated, or gone), by key and token: a reply that named them
	// first in line may come after (see standingHead)
	leftLine *lately.Marks

	ps          *redis.PubSub // nil until subscribed
	subscribing bool
	heard       bool  // the subscription is confirmed: seats sent reach us
	subSeq      int64 // counts the subscription's (re)confirmations and losses
	closed      bool
}

func newWaitRegistry() waitRegistry {
	return waitRegistry{waiters: map[waitKey]*waiter{}, keys: map[string]*keyWaits{},
		leftLine: &lately.Marks{For: leftLineFor, Max: earlyMax}}
}

// leftLineFor is how long the registry remembers a waiter that left (see
// waitRegistry.leftLine): longer than what a reply says of the line is
// used (nextHeadFor).
const leftLineFor = 2 * nextHeadFor

// add registers w before its first call, so that a seat given to it in
// that call finds it.
func (s *Service) add(w *waiter) {
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waiters[waitKey{w.req.key, w.token}] = w
	kw := r.keys[w.req.key]
	if kw == nil {
		kw = &keyWaits{nudge: make(chan struct{}, 1), backoff: backoffBase, missed: true}
		r.keys[w.req.key] = kw
	}
	kw.n++
	kw.capacity = w.req.capacity
	w.inRoom = true
	kw.joined++
	if w.isAcquire() {
		kw.acquires++
	}
	if !w.req.cfg.startsOnSeat {
		kw.others++
	}
}

// isAcquire reports whether w is an Acquire call (tasks' tokens are their
// queue and ID).
func (w *waiter) isAcquire() bool { return strings.HasPrefix(w.token, acquireTokenPrefix) }

// waitsHere starts, for w that waits in the room now, its key's recheck
// loop and this Service's subscription, unless they run. A seat sent
// before the subscription is confirmed is found by the next recheck.
func (s *Service) waitsHere(w *waiter) {
	r := &s.waits
	r.mu.Lock()
	w.joined = true
	kw := r.keys[w.req.key]
	start := kw != nil && !kw.looping
	if start {
		kw.looping = true
	}
	subscribe := r.startsListening()
	r.mu.Unlock()
	if subscribe {
		go s.listen()
	}
	if start {
		go s.recheckLoop(w.req.key, kw)
	}
}

// startsListening reports whether the caller should start this Service's
// subscription (listen), and notes that it does. Caller holds mu.
func (r *waitRegistry) startsListening() bool {
	subscribe := !r.subscribing && r.ps == nil && !r.closed
	if subscribe {
		r.subscribing = true
	}
	return subscribe
}

// listening reports whether this Service's seat channel is confirmed; it
// starts the subscription when none runs.
func (s *Service) listening() bool {
	r := &s.waits
	r.mu.Lock()
	heard, subscribe := r.heard, r.startsListening()
	r.mu.Unlock()
	if subscribe {
		go s.listen()
	}
	return heard
}

// remove unregisters w: a seat sent to it later is given back. It reports
// the seat given to it before, if any: the caller takes it or gives it
// back.
func (s *Service) remove(w *waiter) (seatMsg, bool) {
	s.waits.mu.Lock()
	promote := s.waits.removeLocked(w)
	s.waits.mu.Unlock()
	return s.removed(w, promote)
}

// removeLocked is remove's part under the registry's mu (held): it reports
// whether waiters behind may join in w's stead (see removed).
func (r *waitRegistry) removeLocked(w *waiter) (promote bool) {
	wk := waitKey{w.req.key, w.token}
	if r.waiters[wk] == w {
		if w.standing {
			r.leftLine.Mark(letOutKey(w.req.key, w.token))
		}
		delete(r.waiters, wk)
		if kw := r.keys[w.req.key]; kw != nil {
			if w.inRoom {
				kw.joined--
				promote = len(kw.behind) > 0
			} else {
				kw.leaveBehind(w)
			}
			if w.isAcquire() {
				kw.acquires--
			}
			if !w.req.cfg.startsOnSeat {
				kw.others--
			}
			if kw.n--; kw.n == 0 && !kw.looping {
				delete(r.keys, w.req.key)
			}
		}
	}
	w.done = true
	return promote
}

// removed is remove's part after the registry's mu: the waiters behind
// join in w's stead, and the seat given to w before, if any, is returned.
func (s *Service) removed(w *waiter, promote bool) (seatMsg, bool) {
	if promote {
		s.promote(w.req.key)
	}
	select {
	case m := <-w.seat:
		return m, true
	default:
		return seatMsg{}, false
	}
}

// deliver gives the seat m of key to this Service's waiter of token. A
// seat nobody here waits for any more was given to a waiter that left: its
// leave gives the seat back (leave.lua). It reports whether it did.
func (s *Service) deliver(key, token string, m seatMsg) bool {
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.waiters[waitKey{key, token}]
	if w == nil || w.done || w.member != m.member {
		return false
	}
	w.done = true
	w.settled, w.later = m.settled, m.later
	w.seat <- m
	if w.enrolled {
		// Its task may not come here (see enrolSeatGrace).
		w.expiry.Reset(enrolSeatGrace)
	}
	return true
}

// settledWith reports whether w's seat came with its standby place given
// on, and the tokens let out in its place (see WithStartOnSeat).
func (s *Service) settledWith(w *waiter) ([]string, bool) {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	return w.later, w.settled
}

// allStartOnSeat reports whether every waiter of key here starts as its
// seat comes (WithStartOnSeat), so that a release may give their places
// on with their seats.
func (s *Service) allStartOnSeat(key string) bool {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	kw := s.waits.keys[key]
	return kw == nil || kw.others == 0
}

// failKey ends every wait of key with err (the store failed).
func (s *Service) failKey(key string, err error) {
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	for wk, w := range r.waiters {
		if wk.key == key && !w.done {
			w.done = true
			w.fail = err
			close(w.failed)
		}
	}
}

// recheckLoop is the safety net of this Service's waiters of key (see
// Waiting in a process); it ends when none is left.
func (s *Service) recheckLoop(key string, kw *keyWaits) {
	r := &s.waits
	for {
		r.mu.Lock()
		wait := kw.backoff/2 + rand.N(kw.backoff/2+1)
		if !kw.earliest.IsZero() {
			if now, known := s.clock.now(); known {
				if e := kw.earliest.Sub(time.UnixMicro(now)) + 2*time.Millisecond; e < wait {
					wait = max(e, time.Millisecond)
				}
			}
		}
		r.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-kw.nudge:
		case <-s.closed:
		}
		t.Stop()
		if s.isClosed() {
			s.failKey(key, &AcquisitionError{Key: key, Reason: ReasonShutdown, Err: errShutdown})
			r.mu.Lock()
			if r.keys[key] == kw {
				delete(r.keys, key)
			}
			r.mu.Unlock()
			return
		}
		r.mu.Lock()
		if kw.n == 0 {
			if r.keys[key] == kw {
				delete(r.keys, key)
			}
			r.mu.Unlock()
			return
		}
		args := s.settleArgs(key, "mode", "recheck", "capacity", kw.capacity, "procttl", presenceTTL.Milliseconds())
		if kw.acquires > 0 {
			args = append(args, "head", "1")
		}
		// Until the subscription is confirmed, and once after each
		// confirmation, a recheck also asks for the seats sent meanwhile.
		asked := int64(-1)
		if kw.missed || !r.heard {
			args = append(args, s.membersOf(key)...)
			if r.heard {
				asked = r.subSeq
			}
		}
		r.mu.Unlock()
		sent := time.Now()
		rep, err := s.runBatched(acquireScript, s.keysFor(key), args...)
		if err == nil {
			err = s.afterRecheck(key, kw, rep, sent, asked)
		}
		if err != nil {
			s.log.Warn("semaphore: recheck for waiters failed", "key", key, "err", err)
			s.failKey(key, &AcquisitionError{Key: key, Reason: ReasonError, Err: err})
		}
	}
}

// membersOf lists the waiting tokens of key and the seats they asked for,
// as a recheck's "mine" arguments. Caller holds the registry's mu.
func (s *Service) membersOf(key string) []any {
	var out []any
	n := 0
	for wk, w := range s.waits.waiters {
		if wk.key != key || w.done || !w.inRoom {
			continue // no longer waits, or not in the room (behind.go)
		}
		n++
		out = append(out, "t"+strconv.Itoa(n), w.token, "m"+strconv.Itoa(n), w.member)
	}
	return append([]any{"mine", n}, out...)
}

// afterRecheck hands on what a recheck gave, counts an attempt for each
// waiter of key, ends the waits that used up their WithMaxAttempts, and
// sets the next backoff. asked is the subscription's sequence number when
// the recheck asked for the seats sent meanwhile and the subscription was
// confirmed (-1 otherwise): once that recheck is answered, no seat was
// missed, unless the subscription changed since.
func (s *Service) afterRecheck(key string, kw *keyWaits, rep reply, sent time.Time, asked int64) error {
	now, err := rep.int("now")
	if err != nil {
		return err
	}
	earliest, err := rep.int("earliest")
	if err != nil {
		return err
	}
	s.clock.observeMillis(now, sent, time.Now())
	s.passOnFrom(key, rep, time.UnixMilli(now), true)
	s.rejoin(key, rep.strings("lost"))
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	if asked >= 0 && r.heard && r.subSeq == asked {
		kw.missed = false
	}
	if resend, _ := rep.int("resend"); resend == 1 {
		// The process's presence had been dropped (it was not heard of
		// for a while): the next recheck names its waiters, and those
		// that were dropped or stepped aside join again.
		kw.missed = true
	}
	kw.presentBy(sent)
	kw.earliest = time.Time{}
	if earliest > 0 {
		kw.earliest = time.UnixMilli(earliest)
	}
	floor, ceiling := backoffBase, backoffMax
	if r.heard {
		// Seats reach us as messages: the recheck is only the safety net,
		// and renews the process's presence well within presenceTTL.
		floor, ceiling = backoffMax/4, heardBackoffMax
	}
	kw.backoff = min(max(kw.backoff*2, floor), ceiling)
	for wk, w := range r.waiters {
		if wk.key != key || w.done {
			continue
		}
		w.attempts++
		if n := w.req.cfg.maxAttempts; n > 0 && w.attempts >= n {
			w.done = true
			w.fail = &AcquisitionError{Key: key, Reason: ReasonExhausted, Attempts: w.attempts}
			close(w.failed)
		}
	}
	return nil
}

// rejoin puts waiters of key that the room dropped (their process was not
// heard of for long) back among the waiting.
func (s *Service) rejoin(key string, tokens []string) {
	for _, token := range tokens {
		s.waits.mu.Lock()
		w := s.waits.waiters[waitKey{key, token}]
		// It got its seat meanwhile (and may have run already), or its
		// first call is still on its way.
		gone := w == nil || w.done || !w.joined
		var req request
		if !gone {
			req = w.req // Entry.Wait sets its options under the lock
		}
		s.waits.mu.Unlock()
		if gone {
			continue
		}
		s.log.Warn("semaphore: a waiter was dropped while this process was not heard of; it waits again", "key", key)
		// A task standing by comes back as it came: with a standby place
		// if one is free, else parked (its wait ends, and its task goes
		// back to its queue), so that the slots holding a task that does
		// not run never outnumber the places.
		mode, extra := "join", []any(nil)
		if room := req.cfg.room; room != nil {
			mode, extra = "enter", room.args()
		}
		p, rep, err := s.ask(req, w, mode, extra...)
		switch {
		case err != nil:
			s.log.Warn("semaphore: rejoin the waiting", "key", key, "err", err)
		case p != nil:
			s.deliverPermit(w, p)
		case mode == "enter" && rep.str("outcome") != "standby":
			s.failWaiter(w, &AcquisitionError{Key: key, Reason: ReasonTimeout, Attempts: s.attemptsOf(w), Err: errPlaceGone})
		}
	}
}

// errPlaceGone ends the wait of a task standing by whose standby place went
// to another task while its process was not heard of, when no place was
// free for it as it came back: it is parked, with its arrival.
var errPlaceGone = errors.New("semaphore: the standby place went to another task while this process was not heard of; parked")

// deliverPermit hands w a seat a call of its own got for it.
func (s *Service) deliverPermit(w *waiter, p *Permit) {
	if !s.deliver(w.req.key, w.token, seatMsg{member: p.member, fence: p.fence, now: p.AcquiredAt()}) {
		s.giveBack(p)
	}
}

// attemptsOf is how many store calls were made for w.
func (s *Service) attemptsOf(w *waiter) int {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	return w.attempts
}

// listen subscribes to this Service's seat channel and reads it until the
// Service closes. Seats sent before the subscription was confirmed, or
// while it was cut, are asked for again by the next recheck.
func (s *Service) listen() {
	r := &s.waits
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-s.closed
		cancel()
	}()
	ps := s.rdb.Subscribe(ctx, s.seatPrefix()+s.id)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		_ = ps.Close()
		return
	}
	r.ps = ps
	r.mu.Unlock()
	retry := backoffBase
	for {
		msg, err := ps.Receive(ctx)
		switch m := msg.(type) {
		case *redis.Subscription:
			r.mu.Lock()
			r.heard = m.Kind == "subscribe"
			r.subSeq++
			r.markMissed()
			heard := r.heard
			r.mu.Unlock()
			if !heard {
				s.drainAllSpares(false) // a recall could be missed now
			}
			retry = backoffBase
			s.nudgeAll()
			continue
		case *redis.Message:
			if key, ok := strings.CutPrefix(m.Payload, spareMessage); ok {
				s.recallSpare(key)
			} else if key, token, seat, ok := parseSeatMessage(m.Payload); ok {
				if !s.deliver(key, token, seat) {
					// A waiter that left gives its seat back as it leaves; one
					// enrolled by a call whose reply is still on its way
					// takes it as it is registered.
					s.keepEarly(key, token, seat)
				}
			} else {
				s.log.Warn("semaphore: a seat message this build cannot read", "payload", m.Payload)
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, redis.ErrClosed) {
			r.mu.Lock()
			wasHeard := r.heard
			r.heard = false
			r.subSeq++
			r.markMissed()
			r.mu.Unlock()
			if wasHeard {
				s.log.Warn("semaphore: seat channel lost; waiters recheck until it is back", "err", err)
			}
			s.drainAllSpares(false) // a recall could be missed now
			select {
			case <-time.After(retry):
			case <-ctx.Done():
				return
			}
			retry = min(2*retry, backoffMax)
		}
	}
}

// markMissed notes that seats may have been sent while the subscription
// was not confirmed: every key's next recheck asks for them. Caller holds
// mu.
func (r *waitRegistry) markMissed() {
	for _, kw := range r.keys {
		kw.missed = true
	}
}

// nudgeAll makes every recheck loop look now.
func (s *Service) nudgeAll() {
	r := &s.waits
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, kw := range r.keys {
		kw.backoff = backoffBase
		select {
		case kw.nudge <- struct{}{}:
		default:
		}
	}
}

// stopListening closes the subscription (Close calls it).
func (s *Service) stopListening() {
	r := &s.waits
	r.mu.Lock()
	ps := r.ps
	r.ps, r.heard, r.closed = nil, false, true
	r.mu.Unlock()
	if ps != nil {
		_ = ps.Close() // only closes our own subscription connection
	}
}

// parseSeatMessage reads a seat message (seatMessage in room.lua): key,
// token, member and fence, each after its length and a colon, then the
// server's time in ms.
func parseSeatMessage(p string) (key, token string, seat seatMsg, ok bool) {
	var parts [4]string
	for i := range parts {
		var n int
		if n, p, ok = cutLength(p); !ok || n > len(p) {
			return "", "", seatMsg{}, false
		}
		parts[i], p = p[:n], p[n:]
	}
	ms, err := strconv.ParseInt(p, 10, 64)
	if err != nil {
		return "", "", seatMsg{}, false
	}
	fence, err := strconv.ParseUint(parts[3], 10, 64)
	if err != nil {
		return "", "", seatMsg{}, false
	}
	return parts[0], parts[1], seatMsg{member: parts[2], fence: fence, now: time.UnixMilli(ms)}, true
}

// cutLength reads "<n>:" at the start of p.
func cutLength(p string) (int, string, bool) {
	for i := 0; i < len(p); i++ {
		if p[i] == ':' {
			n, err := strconv.Atoi(p[:i])
			return n, p[i+1:], err == nil && n >= 0
		}
	}
	return 0, p, false
}
