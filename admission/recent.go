package admission

import (
	"slices"
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
// keeps at most recentMax. Keys this process holds seats of are kept and
// listed while held, whatever their age.
type recentKeys struct {
	mu   sync.Mutex
	keys map[string]recentKey
	held map[string]int // rendered key -> seats of it this process holds
}

type recentKey struct {
	template string
	capacity int
	seen     time.Time
}

const (
	recentFor = 10 * time.Minute
	recentMax = 10000
	// recentListMax bounds the rendered keys DeclaredKeys lists beside the
	// held ones: the monitoring page reads each listed key's holders, so
	// 10,000 tenants must not cost 10,000 Redis calls a refresh.
	recentListMax = 200
)

func newRecentKeys() *recentKeys {
	return &recentKeys{keys: map[string]recentKey{}, held: map[string]int{}}
}

func (r *recentKeys) touch(key, template string, capacity int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if _, ok := r.keys[key]; !ok && len(r.keys) >= recentMax {
		r.pruneLocked(now)
		if len(r.keys) >= recentMax {
			r.evictOldestLocked(recentMax / 2)
		}
	}
	r.keys[key] = recentKey{template: template, capacity: capacity, seen: now}
}

// evictOldestLocked forgets the n least recently used keys that are not
// held: once per recentMax/2 new keys when more keys than recentMax are in
// use within recentFor.
func (r *recentKeys) evictOldestLocked(n int) {
	type aged struct {
		key  string
		seen time.Time
	}
	all := make([]aged, 0, len(r.keys))
	for k, v := range r.keys {
		if r.held[k] == 0 {
			all = append(all, aged{k, v.seen})
		}
	}
	slices.SortFunc(all, func(a, b aged) int { return a.seen.Compare(b.seen) })
	for _, a := range all[:min(n, len(all))] {
		delete(r.keys, a.key)
	}
}

// hold counts a seat of a rendered key this process takes (+1) or gives
// back (-1). A held key is remembered (and listed) until it is given back,
// beyond recentMax if need be: there are at most as many as seats held.
func (r *recentKeys) hold(key, template string, capacity, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held[key] += delta; r.held[key] <= 0 {
		delete(r.held, key)
		return
	}
	v, ok := r.keys[key]
	if !ok {
		v = recentKey{template: template, capacity: capacity}
	}
	v.seen = time.Now()
	r.keys[key] = v
}

func (r *recentKeys) pruneLocked(now time.Time) {
	for k, v := range r.keys {
		if now.Sub(v.seen) > recentFor && r.held[k] == 0 {
			delete(r.keys, k)
		}
	}
}

// list returns the held rendered keys and the most recently used others,
// recentListMax at most.
func (r *recentKeys) list() []DeclaredKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked(time.Now())
	type entry struct {
		key string
		recentKey
	}
	var held, others []entry
	for k, v := range r.keys {
		if r.held[k] > 0 {
			held = append(held, entry{k, v})
		} else {
			others = append(others, entry{k, v})
		}
	}
	if len(others) > recentListMax {
		slices.SortFunc(others, func(a, b entry) int { return b.seen.Compare(a.seen) })
		others = others[:recentListMax]
	}
	out := make([]DeclaredKey, 0, len(held)+len(others))
	for _, e := range append(held, others...) {
		out = append(out, DeclaredKey{Key: e.key, Capacity: e.capacity, Template: e.template})
	}
	return out
}

// DeclaredKeys lists every plain cap key and template of the config, then
// the rendered keys of templates that this process holds seats of, and the
// ones it rendered most recently (at most 200 of those).
func (a *Admitter) DeclaredKeys() []DeclaredKey {
	var out []DeclaredKey
	for _, s := range a.Table.Caps() {
		d := DeclaredKey{Key: s.Declared(), Capacity: s.Cap.Capacity}
		if s.IsTemplate() {
			d.Template = s.Declared()
		}
		out = append(out, d)
	}
	return append(out, a.recentCaps.list()...)
}

// KeyLabel names a cap key for metrics: the template a rendered key came
// from, so that per-tenant keys do not make one series each; other keys as
// they are. A rendered key this process no longer remembers is matched
// against the templates, so that no tenant ever gets a series of its own.
func (a *Admitter) KeyLabel(key string) string {
	a.recentCaps.mu.Lock()
	k, ok := a.recentCaps.keys[key]
	a.recentCaps.mu.Unlock()
	if ok {
		return k.template
	}
	return a.Table.CapTemplateOf(key)
}

// RenderedRateKeys lists the rate-limit keys this process rendered from
// templates lately (the 200 it used last), for the monitoring page.
func (a *Admitter) RenderedRateKeys() []string {
	var out []string
	for _, k := range a.recentRates.list() {
		out = append(out, k.Key)
	}
	return out
}
