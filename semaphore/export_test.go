package semaphore

import "time"

// LocalWaiters counts the waits of s for key (Acquire calls, and tasks
// standing by) that are in line: their join reached Redis, or they wait
// behind with their arrival (behind.go), so that a test that waits for
// one before it starts the next knows their order. (A wait is registered
// before its first call, see add.)
func (s *Service) LocalWaiters(key string) int {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	n := 0
	for wk, w := range s.waits.waiters {
		if wk.key == key && (w.joined || w.behind) && !w.done {
			n++
		}
	}
	return n
}

// LocalHandOvers counts the seats s gave to a waiter of its own in memory,
// for tests.
func (s *Service) LocalHandOvers() int64 { return s.localHandOvers.Load() }

// KeySlot is the Redis Cluster hash slot of a key name, for tests.
func KeySlot(key string) uint16 { return keySlot(key) }

// LineBackoff is how long the recheck loop of key's waiters sleeps before
// its next recheck (0 when none waits), for tests that need a grown
// backoff.
func (s *Service) LineBackoff(key string) time.Duration {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	if kw := s.waits.keys[key]; kw != nil && kw.n > 0 {
		return kw.backoff
	}
	return 0
}

// QuickScriptHash is the SHA1 that calls of quick.lua name, for tests.
func QuickScriptHash() string { return quickScript.Hash() }

// AcquireScriptHash is the SHA1 that calls of acquire.lua name, for tests.
func AcquireScriptHash() string { return acquireScript.Hash() }

// LateJoins counts the waits of s for key that waited behind and whose
// join of the room is on the wire (behind.go), for tests.
func (s *Service) LateJoins(key string) int {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	n := 0
	for wk, w := range s.waits.waiters {
		if wk.key == key && !joinEnded(w) {
			n++
		}
	}
	return n
}

// WaitingBehind counts the waits of s for key that wait behind in the
// process, not in the room (behind.go), for tests.
func (s *Service) WaitingBehind(key string) int {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	if kw := s.waits.keys[key]; kw != nil {
		return len(kw.behind)
	}
	return 0
}

// PendingWakes are the tokens e hands to OnWake as it settles: let out in
// its place by the release that gave it its seat (WithStartOnSeat).
func (e *Entry) PendingWakes() []string { return e.later }

// EarliestArmed reports whether key's recheck loop in s waits for a lease
// expiry still to come (earliestArmed), for tests.
func (s *Service) EarliestArmed(key string) bool { return s.earliestArmed(key) }

// NoLapse reports whether a release of p now would tell release.lua that
// no lease lapsed (noLapse), for tests.
func (s *Service) NoLapse(p *Permit) bool { return s.noLapse(p) }

// Enrolled reports whether a release of s enrolled token in key's line and
// no Enter took it up yet (enrol.go), for tests.
func (s *Service) Enrolled(key, token string) bool {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	w := s.waits.waiters[waitKey{key, token}]
	return w != nil && w.enrolled
}

// BeforeEnrol has f run as each reply's enrolled tokens (token, permit
// id, seat member, arrival, ...) are about to be registered, so that a
// test can hold a reply back. Set it before s is used.
func (s *Service) BeforeEnrol(f func(enrolled []string)) { s.beforeEnrol = f }

// MissSeats has the recheck loop of key's waiters in s ask for the seats
// given to them now, as it does once the subscription was down (which it
// counts as a change of the subscription, so that the reply of a recheck
// sent before does not clear it).
func (s *Service) MissSeats(key string) {
	s.waits.mu.Lock()
	s.waits.subSeq++
	if kw := s.waits.keys[key]; kw != nil {
		kw.missed = true
	}
	s.waits.mu.Unlock()
	s.NudgeRecheck(key)
}

// NudgeRecheck has the recheck loop of key's waiters in s look now.
func (s *Service) NudgeRecheck(key string) {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	if kw := s.waits.keys[key]; kw != nil {
		select {
		case kw.nudge <- struct{}{}:
		default:
		}
	}
}

// PresentAt is when the last call that renewed s's presence in key's room
// was sent (zero when none is known).
func (s *Service) PresentAt(key string) time.Time {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	if kw := s.waits.keys[key]; kw != nil {
		return kw.presentAt
	}
	return time.Time{}
}

// KeptEarly reports whether s keeps a seat of key's token for a waiter
// enrolled later (keepEarly).
func (s *Service) KeptEarly(key, token string) bool { return s.early.Recent(letOutKey(key, token)) }

// TrustLineFor sets how long s takes what a reply said of a key's line for
// true (nextHeadFor), for tests whose steps take longer under the race
// detector.
func (s *Service) TrustLineFor(d time.Duration) { s.nextHeadFor = d }

// StandingBy counts s's tasks of key whose Entry waits (Entry.Wait), for
// tests.
func (s *Service) StandingBy(key string) int {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	n := 0
	for wk, w := range s.waits.waiters {
		if wk.key == key && w.standing && !w.done {
			n++
		}
	}
	return n
}

// TaskMoves counts the seats s handed in memory to tasks standing by, for
// tests.
func (s *Service) TaskMoves() int64 { return s.taskMoves.Load() }

// NoteLine has s take tokens for the first of key's line, as if a reply
// said so now (noteNext), for tests.
func (s *Service) NoteLine(key string, tokens ...string) {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	if kw := s.waits.keys[key]; kw != nil {
		kw.next, kw.nextAt = tokens, time.Now()
	}
}
