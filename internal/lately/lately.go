// Package lately remembers which keys something happened to lately: a set
// of marks that lapse after a while, bounded in size.
package lately

import (
	"maps"
	"sync"
	"time"
)

// Marks is a set of keys marked within the last For. At most Max keys are
// kept: beyond that, marks that lapsed are dropped, and a new key is not
// marked while all are live (a mark is a hint: a missed one costs a caller
// a slower path, never a wrong answer). Safe for concurrent use.
type Marks struct {
	For time.Duration
	Max int

	mu sync.Mutex
	at map[string]time.Time
}

// Mark marks key now.
func (m *Marks) Mark(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if m.at == nil {
		m.at = map[string]time.Time{}
	}
	if _, known := m.at[key]; !known && len(m.at) >= m.Max {
		maps.DeleteFunc(m.at, func(_ string, at time.Time) bool { return now.Sub(at) > m.For })
		if len(m.at) >= m.Max {
			return
		}
	}
	m.at[key] = now
}

// Forget drops key's mark.
func (m *Marks) Forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.at, key)
}

// Within reports whether key was marked within d, and within For.
func (m *Marks) Within(key string, d time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.at[key]
	return ok && time.Since(at) <= min(d, m.For)
}

// Recent reports whether key was marked within For.
func (m *Marks) Recent(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.at[key]
	return ok && time.Since(at) <= m.For
}
