package worker

import (
	"sort"
	"sync"
	"time"
)

// DeclaredKey is a semaphore key the config declares, or a key rendered
// recently from a declared template.
type DeclaredKey struct {
	Key      string
	Capacity int
	Template string // the template of a rendered key; equal to Key for the template itself; "" for a plain key
}

// recentKeys remembers the keys rendered from templates lately, so that the
// monitoring page can show them; it forgets keys unused for recentFor and
// keeps at most recentMax.
type recentKeys struct {
	mu   sync.Mutex
	keys map[string]recentKey
}

type recentKey struct {
	template string
	capacity int
	seen     time.Time
}

const (
	recentFor = 10 * time.Minute
	recentMax = 10000
)

func newRecentKeys() *recentKeys { return &recentKeys{keys: map[string]recentKey{}} }

func (r *recentKeys) touch(key, template string, capacity int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if _, ok := r.keys[key]; !ok && len(r.keys) >= recentMax {
		r.pruneLocked(now)
		if len(r.keys) >= recentMax {
			return
		}
	}
	r.keys[key] = recentKey{template: template, capacity: capacity, seen: now}
}

func (r *recentKeys) pruneLocked(now time.Time) {
	for k, v := range r.keys {
		if now.Sub(v.seen) > recentFor {
			delete(r.keys, k)
		}
	}
}

func (r *recentKeys) list() []DeclaredKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked(time.Now())
	out := make([]DeclaredKey, 0, len(r.keys))
	for k, v := range r.keys {
		out = append(out, DeclaredKey{Key: k, Capacity: v.capacity, Template: v.template})
	}
	return out
}

// DeclaredKeys lists every plain key and template of the config, with the
// keys rendered from the templates lately.
func (w *Worker) DeclaredKeys() []DeclaredKey {
	seen := map[string]bool{}
	var out []DeclaredKey
	for _, specs := range w.caps.byType {
		for _, s := range specs {
			if seen[s.Key] {
				continue
			}
			seen[s.Key] = true
			d := DeclaredKey{Key: s.Key, Capacity: s.Capacity}
			if s.tmpl.IsTemplate() {
				d.Template = s.Key
			}
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return append(out, w.recent.list()...)
}

// KeyLabel names key for metrics: the template a rendered key came from, so
// that per-tenant keys do not make one series each; other keys as they are.
func (w *Worker) KeyLabel(key string) string {
	w.recent.mu.Lock()
	defer w.recent.mu.Unlock()
	if k, ok := w.recent.keys[key]; ok {
		return k.template
	}
	return key
}
