package semaphore

import "time"

// LocalWaiters counts the Acquire calls of s waiting for key, for tests.
func (s *Service) LocalWaiters(key string) int {
	s.mu.Lock()
	l := s.lines[key]
	s.mu.Unlock()
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiters)
}

// LocalHandOvers counts the seats s handed to a local waiter in memory
// (the store learning of it one call later), for tests.
func (s *Service) LocalHandOvers() int64 { return s.localHandOvers.Load() }

// KeySlot is the Redis Cluster hash slot of a key name, for tests.
func KeySlot(key string) uint16 { return keySlot(key) }

// LineBackoff is how long the line of key sleeps before its next attempt
// (0 when there is none), for tests that need a grown backoff.
func (s *Service) LineBackoff(key string) time.Duration {
	l := s.lineOf(key)
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.backoff
}
