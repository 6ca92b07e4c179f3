package monitoring

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// KeyInfo is a semaphore key the monitoring server shows, as the worker
// declares it.
type KeyInfo struct {
	// Key is a declared key ("legacy-api"), a declared template
	// ("tenant:{tenant_id}"), or a key rendered from a template
	// ("tenant:acme").
	Key string
	// Capacity is the key's seats (for a template: the seats of each
	// rendered key; for a rendered key: its own, after capacity_overrides).
	Capacity int
	// Template is empty for a plain key. A declared template sets it to
	// itself (Template == Key); a rendered key sets it to the template it
	// came from. The page shows a template as one row with the busiest of
	// its rendered keys beneath.
	Template string
}

// The kinds of rows of GET /api/semaphores.
const (
	KindSemaphore = "semaphore"
	KindRate      = "rate"
)

// SemaphoreStatus is one row of GET /api/semaphores of kind "semaphore".
type SemaphoreStatus struct {
	Kind string `json:"kind"` // KindSemaphore
	Key  string `json:"key"`
	// Capacity is the capacity in force: a runtime override (0: paused),
	// else ConfiguredCapacity.
	Capacity           int            `json:"capacity"`
	ConfiguredCapacity int            `json:"configured_capacity"`
	Override           bool           `json:"override"` // Capacity comes from a runtime override
	Used               int            `json:"used"`     // seats held (a holder of weight n holds n); for a template, summed over its rendered keys
	Holders            []HolderStatus `json:"holders"`
	// Waiting is the tasks waiting for a seat, fleet-wide, read from the
	// key's waiting room: parked in Redis, or holding a standby place.
	// For a template, summed over its rendered keys the worker listed.
	Waiting int `json:"waiting"`
	// Standby is the standby places in use: tasks waiting in a worker
	// slot for the next seat, or on their way to one (a template: summed).
	Standby int `json:"standby"`
	// Aside is the tasks that stepped out of the line for a while and
	// keep their place in it (their queue is paused, their worker died
	// with them, or they wait for another key); not in Waiting (a
	// template: summed).
	Aside int `json:"aside"`
	// OldestWaitSeconds is how long the task that has waited longest has
	// waited (server clock); 0 when none waits; for a template, the
	// longest of its rendered keys.
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
	// FairValues are, on a key with fair_by, its values with the most
	// tasks waiting, most first (not summed for a template: see Busiest).
	FairValues []semaphore.ShareWaiting `json:"fair_values,omitempty"`

	// Template rows only: the row stands for a per-payload template.
	Template bool `json:"template,omitempty"`
	// Keys is how many rendered keys of the template the worker listed.
	Keys int `json:"keys,omitempty"`
	// Busiest are the busiest of those rendered keys (at most
	// ServerOptions.BusiestKeys, only keys in use), busiest first.
	Busiest []SemaphoreStatus `json:"busiest,omitempty"`
}

// HolderStatus is a live holder of a seat.
type HolderStatus struct {
	PermitID  string    `json:"permit_id"`
	TaskID    string    `json:"task_id"` // the holder's label: the asynq task ID
	ExpiresAt time.Time `json:"expires_at"`
	Seats     int       `json:"seats"` // its weight: the seats it holds
}

// load is how full a row is, for ordering busiest first.
func (s SemaphoreStatus) load() float64 {
	if s.Template {
		if len(s.Busiest) == 0 {
			return 0
		}
		return s.Busiest[0].load()
	}
	if s.Capacity <= 0 {
		return float64(s.Used)
	}
	return float64(s.Used) / float64(s.Capacity)
}

// busiestFirst orders rows by load, then tasks waiting, then seats used,
// then key.
func busiestFirst(a, b SemaphoreStatus) int {
	if c := cmp.Compare(b.load(), a.load()); c != 0 {
		return c
	}
	if c := cmp.Compare(b.Waiting, a.Waiting); c != 0 {
		return c
	}
	if c := cmp.Compare(b.Used, a.Used); c != 0 {
		return c
	}
	return cmp.Compare(a.Key, b.Key)
}

// lookupParallelism bounds the Holders calls in flight for one snapshot.
const lookupParallelism = 8

// snapshotter reads the state of every listed key from the semaphore and
// caches it briefly, so that several open pages cost one round of Redis
// calls per interval.
type snapshotter struct {
	sem       *semaphore.Service
	keys      func(context.Context) ([]KeyInfo, error)
	busiest   int
	cacheFor  time.Duration
	limiter   *ratelimit.Limiter // nil: no rate rows
	rateKeys  func(context.Context) ([]RateKeyInfo, error)
	overrides *control.Reader // nil: configured values only

	mu   sync.Mutex // held across a reading
	at   time.Time
	last *pageSnapshot
}

// pageSnapshot is one reading of every row.
type pageSnapshot struct {
	semaphores []SemaphoreStatus
	rates      []RateLimitStatus
}

// rows are the rows of GET /api/semaphores: the semaphores busiest first,
// then the rate limits busiest first. A nil snapshot has none.
func (p *pageSnapshot) rows() []any {
	out := []any{}
	if p == nil {
		return out
	}
	for _, r := range p.semaphores {
		out = append(out, r)
	}
	for _, r := range p.rates {
		out = append(out, r)
	}
	return out
}

// capacityFor is the capacity in force of a key rendered from template (""
// for a plain key) whose config gives it configured.
func (s *snapshotter) capacityFor(key, template string, configured int) (int, bool) {
	if s.overrides == nil {
		return configured, false
	}
	return s.overrides.CapacityFor(key, template, configured)
}

// invalidate drops the cached snapshot (after a force release).
func (s *snapshotter) invalidate() {
	s.mu.Lock()
	s.at = time.Time{}
	s.mu.Unlock()
}

// isKnown reports whether key is a plain or rendered key the worker lists
// (templates are not: they hold no seats themselves).
func (s *snapshotter) isKnown(ctx context.Context, key string) (bool, error) {
	infos, err := s.keys(ctx)
	if err != nil {
		return false, err
	}
	for _, k := range infos {
		if k.Key == key && k.Template != k.Key {
			return true, nil
		}
	}
	return false, nil
}

// templateStatus is the row of the template name whose rendered keys have
// the configured capacity, without their seats and waiting.
func (s *snapshotter) templateStatus(name string, configured int) SemaphoreStatus {
	capacity, over := s.capacityFor(name, name, configured)
	return SemaphoreStatus{
		Kind: KindSemaphore, Key: name, Capacity: capacity, ConfiguredCapacity: configured, Override: over,
		Holders: []HolderStatus{}, Template: true,
	}
}

// inUse reports whether the key has seats held or tasks waiting.
func (st SemaphoreStatus) inUse() bool { return st.Used > 0 || st.Waiting > 0 }

// count adds the seats and waiting of one of a template's rendered keys to
// the template's row.
func (st *SemaphoreStatus) count(rendered SemaphoreStatus) {
	st.Keys++
	st.Used += rendered.Used
	st.Waiting += rendered.Waiting
	st.Standby += rendered.Standby
	st.Aside += rendered.Aside
	st.OldestWaitSeconds = max(st.OldestWaitSeconds, rendered.OldestWaitSeconds)
}

// setBusiest sets the rendered keys listed beneath a template's row.
func (st *SemaphoreStatus) setBusiest(rendered []SemaphoreStatus) { st.Busiest = rendered }

// snapshot returns the rows of the page.
func (s *snapshotter) snapshot(ctx context.Context) (*pageSnapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.IsZero() && time.Since(s.at) < s.cacheFor {
		return s.last, nil
	}
	sems, err := s.read(ctx)
	if err != nil {
		return nil, err
	}
	rates, err := s.readRates(ctx)
	if err != nil {
		return nil, err
	}
	s.last, s.at = &pageSnapshot{semaphores: sems, rates: rates}, time.Now()
	return s.last, nil
}

func (s *snapshotter) read(ctx context.Context) ([]SemaphoreStatus, error) {
	infos, err := s.keys(ctx)
	if err != nil {
		return nil, err
	}
	// Plain and rendered keys hold seats; read them all, a few at a time.
	lookups, declared := splitKeys(infos)
	rows := newTemplateRows[SemaphoreStatus]()
	for _, k := range declared {
		rows.setTemplate(k.Key, s.templateStatus(k.Key, k.Capacity)) // the template's own entry wins
	}
	results, err := inParallel(len(lookups), func(i int) (SemaphoreStatus, error) { return s.status(ctx, lookups[i]) })
	if err != nil {
		return nil, err
	}
	for i, k := range lookups {
		rows.add(k.Template, results[i], func() SemaphoreStatus { return s.templateStatus(k.Template, k.Capacity) })
	}
	return rows.sorted(s.busiest, busiestFirst), nil
}

// status reads the holders and the waiting room of one key.
func (s *snapshotter) status(ctx context.Context, k KeyInfo) (SemaphoreStatus, error) {
	hs, err := s.sem.Holders(ctx, k.Key)
	if err != nil {
		return SemaphoreStatus{}, err
	}
	room, err := s.sem.RoomStats(ctx, k.Key)
	if err != nil {
		return SemaphoreStatus{}, err
	}
	template := k.Template
	capacity, over := s.capacityFor(k.Key, template, k.Capacity)
	st := SemaphoreStatus{
		Kind: KindSemaphore, Key: k.Key, Capacity: capacity, ConfiguredCapacity: k.Capacity, Override: over,
		Holders: make([]HolderStatus, len(hs)),
		Waiting: room.Waiting, Standby: room.Standby, Aside: room.Aside, OldestWaitSeconds: room.OldestWait.Seconds(), FairValues: room.TopValues,
	}
	for i, h := range hs {
		st.Holders[i] = HolderStatus{PermitID: h.PermitID, TaskID: h.Label, ExpiresAt: h.ExpiresAt.UTC(), Seats: h.Seats}
		st.Used += h.Seats
	}
	return st, nil
}
