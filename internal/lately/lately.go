// Package lately remembers which keys something happened to lately: a set
// of marks that lapse after a while, bounded in size, each with a value
// when its user needs one.
package lately

import (
	"maps"
	"sync"
	"time"
)

// Notes is a set of keys noted within the last For, each with a value. At
// most Max keys are kept: beyond that, notes that lapsed are dropped, and
// a new key is not noted while all are live (a note is a hint: a missed
// one costs a caller a slower path, never a wrong answer). Safe for
// concurrent use.
type Notes[V any] struct {
	For time.Duration
	Max int

	mu sync.Mutex
	at map[string]note[V]
}

// note is a key's value and when it was noted.
type note[V any] struct {
	v  V
	at time.Time
}

// Marks is a set of keys marked within the last For, without values.
type Marks = Notes[struct{}]

// Note notes key with v now. It reports whether it did (Max live notes
// are kept already).
func (m *Notes[V]) Note(key string, v V) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if m.at == nil {
		m.at = map[string]note[V]{}
	}
	if _, known := m.at[key]; !known && len(m.at) >= m.Max {
		maps.DeleteFunc(m.at, func(_ string, n note[V]) bool { return now.Sub(n.at) > m.For })
		if len(m.at) >= m.Max {
			return false
		}
	}
	m.at[key] = note[V]{v: v, at: now}
	return true
}

// Mark notes key now, with V's zero value.
func (m *Notes[V]) Mark(key string) {
	var zero V
	m.Note(key, zero)
}

// Take returns key's value and drops its note, when it was noted within
// For.
func (m *Notes[V]) Take(key string) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.at[key]
	delete(m.at, key)
	if !ok || time.Since(n.at) > m.For {
		var zero V
		return zero, false
	}
	return n.v, true
}

// Forget drops key's note.
func (m *Notes[V]) Forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.at, key)
}

// Within reports whether key was noted within d, and within For.
func (m *Notes[V]) Within(key string, d time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.at[key]
	return ok && time.Since(n.at) <= min(d, m.For)
}

// Recent reports whether key was noted within For.
func (m *Notes[V]) Recent(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.at[key]
	return ok && time.Since(n.at) <= m.For
}
