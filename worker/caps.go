package worker

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/semaphore"
)

// capSpec is one declared cap, parsed.
type capSpec struct {
	CapConfig
	tmpl *config.KeyTemplate
}

// standby is the cap's fleet-wide standby budget: how many of its tasks
// may wait in a worker slot for the next seat at once; default the
// capacity (of the rendered key).
func (c capSpec) standby(capacity int) int {
	if c.Standby != nil {
		return *c.Standby
	}
	return capacity
}

// capTable holds the caps of every task type.
type capTable struct {
	byType map[string][]capSpec

	mu     sync.Mutex
	fullAt map[string]time.Time // key -> when this process last found it full
}

func newCapTable(cfg *Config) (*capTable, error) {
	t := &capTable{byType: map[string][]capSpec{}, fullAt: map[string]time.Time{}}
	for typ, tc := range cfg.Tasks {
		for _, c := range tc.Caps() {
			kt, err := c.KeyTemplate()
			if err != nil {
				return nil, fmt.Errorf("worker: task %q: %w", typ, err)
			}
			t.byType[typ] = append(t.byType[typ], capSpec{CapConfig: c, tmpl: kt})
		}
	}
	return t, nil
}

// Full hints. A task with several caps first tries the ones this process
// found full within fullHintFor, so that while one tenant's cap is full its
// tasks go back without taking (and giving back) a seat of the shared cap
// first. The hints stay few: a key leaves when a seat of it is taken, and
// old ones are dropped when there are more than fullHintMax.
const (
	fullHintFor = time.Second
	fullHintMax = 1024
)

// markFull notes that key was found full.
func (t *capTable) markFull(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if len(t.fullAt) >= fullHintMax {
		maps.DeleteFunc(t.fullAt, func(_ string, at time.Time) bool { return now.Sub(at) > fullHintFor })
		if len(t.fullAt) >= fullHintMax {
			return
		}
	}
	t.fullAt[key] = now
}

// markFree forgets a full hint once a seat of key was taken.
func (t *capTable) markFree(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.fullAt, key)
}

// attemptOrder is the order in which a task tries its seats: the seats
// hinted full first, then the others, each group in key order. The order
// only saves work: no seat is ever held while waiting, so any order is
// free of deadlock; waiting itself is for one seat at a time.
func (t *capTable) attemptOrder(seats []seat) []int {
	order := make([]int, 0, len(seats))
	if len(seats) > 1 {
		t.mu.Lock()
		now := time.Now()
		for i, s := range seats {
			if at, ok := t.fullAt[s.key]; ok && now.Sub(at) <= fullHintFor {
				order = append(order, i)
			}
		}
		t.mu.Unlock()
	}
	for i := range seats {
		if !slices.Contains(order, i) {
			order = append(order, i)
		}
	}
	return order
}

// templateOf returns the template that renders key, or key itself when it
// is a declared plain key or no template renders it. Plain keys win, then
// templates in key order.
func (t *capTable) templateOf(key string) string {
	var tmpls []string
	for _, specs := range t.byType {
		for _, s := range specs {
			if !s.tmpl.IsTemplate() {
				if s.Key == key {
					return key
				}
				continue
			}
			if s.tmpl.Matches(key) {
				tmpls = append(tmpls, s.Key)
			}
		}
	}
	if len(tmpls) == 0 {
		return key
	}
	return slices.Min(tmpls)
}

func (t *capTable) types() []string { return slices.Sorted(maps.Keys(t.byType)) }

// plainKeys are the declared caps whose key is not a template, with their
// specs (the first declaration of each).
func (t *capTable) plainKeys() map[string]capSpec {
	out := map[string]capSpec{}
	for _, specs := range t.byType {
		for _, s := range specs {
			if _, seen := out[s.Key]; !seen && !s.tmpl.IsTemplate() {
				out[s.Key] = s
			}
		}
	}
	return out
}

// seat is one cap of one task, its key rendered and its capacity the one
// in force.
type seat struct {
	spec     capSpec
	key      string
	template string // the key's template; "" for a plain key
	capacity int    // 0: the key is paused
}

// room is how the seat's waiting room is kept (see semaphore.Room).
func (s seat) room(parkedRetry time.Duration) semaphore.Room {
	standby := s.spec.standby(s.capacity)
	if s.capacity == 0 {
		standby = 0 // paused: nobody waits in a slot for a seat that will not come
	}
	return semaphore.Room{
		Standby: standby,
		Hold:    s.spec.WaitTimeout + standbyMargin,
		Transit: transitTime,
		TTL:     3 * parkedRetry,
		Audit:   auditInterval,
	}
}

// Places in the waiting room. A task holding a standby place waits for a
// seat up to its cap's wait_timeout; the place outlives that by
// standbyMargin, so that only a dead worker's place lapses. A task let out
// of the room has transitTime to reach a slot (it is pushed to the front of
// its queue: usually milliseconds) before its place goes back to the room,
// which lets it out again first, if it still waits: so a task deleted on
// its way gives its place back within about a second.
const (
	standbyMargin = 5 * time.Second
	transitTime   = time.Second
)

// seatsFor renders the caps of a task, sorted by key (see renderSeats),
// and remembers rendered keys for monitoring.
func (w *Worker) seatsFor(specs []capSpec, t *asynq.Task) ([]seat, error) {
	seats, err := renderSeats(specs, t.Payload(), w.capacityFor)
	for _, s := range seats {
		if s.template != "" {
			w.recent.touch(s.key, s.template, s.capacity)
		}
	}
	return seats, err
}

// renderSeats renders the caps of a payload, sorted by key: every task
// takes its seats in the same order. capacity gives the capacity in force
// of a rendered key (an operator's override, else the config's).
func renderSeats(specs []capSpec, payload []byte, capacity func(key, template string, configured int) int) ([]seat, error) {
	seats := make([]seat, 0, len(specs))
	for _, s := range specs {
		key, err := s.tmpl.Render(payload)
		if err != nil {
			return nil, err // names the template and the field
		}
		template := ""
		if s.tmpl.IsTemplate() {
			template = s.Key
		}
		seats = append(seats, seat{spec: s, key: key, template: template, capacity: capacity(key, template, s.CapacityFor(key))})
	}
	slices.SortFunc(seats, func(a, b seat) int { return cmp.Compare(a.key, b.key) })
	// Two caps that render one key ("region:{from}" and "region:{to}" of
	// a task that stays in its region) are one semaphore: one seat of it,
	// of the smaller capacity, holds both caps.
	out := seats[:0]
	for _, s := range seats {
		if n := len(out); n > 0 && out[n-1].key == s.key {
			if s.capacity < out[n-1].capacity {
				out[n-1] = s
			}
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// capacityFor is the capacity in force of a rendered key: an operator's
// override of the key, else of its template, else configured.
func (w *Worker) capacityFor(key, template string, configured int) int {
	return capacityIn(w.overrides, key, template, configured)
}

func capacityIn(overrides *control.Reader, key, template string, configured int) int {
	if overrides == nil {
		return configured
	}
	capacity, _ := overrides.CapacityFor(key, template, configured)
	return capacity
}
