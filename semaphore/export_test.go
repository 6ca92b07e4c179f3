package semaphore

import "time"

// LocalWaiters counts the waits of s for key (Acquire calls, and tasks
// standing by), for tests.
func (s *Service) LocalWaiters(key string) int {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	if kw := s.waits.keys[key]; kw != nil {
		return kw.n
	}
	return 0
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
