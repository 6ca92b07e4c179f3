package monitoring

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

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

// SemaphoreStatus is one row of GET /api/semaphores.
type SemaphoreStatus struct {
	Key      string         `json:"key"`
	Capacity int            `json:"capacity"`
	Used     int            `json:"used"` // live holders; for a template, summed over its rendered keys
	Holders  []HolderStatus `json:"holders"`

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

// busiestFirst orders rows by load, then seats used, then key.
func busiestFirst(a, b SemaphoreStatus) int {
	if c := cmp.Compare(b.load(), a.load()); c != 0 {
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
	sem      *semaphore.Service
	keys     func(context.Context) ([]KeyInfo, error)
	busiest  int
	cacheFor time.Duration

	mu   sync.Mutex // held across a reading
	at   time.Time
	rows []SemaphoreStatus
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

// snapshot returns the rows of the page, busiest first.
func (s *snapshotter) snapshot(ctx context.Context) ([]SemaphoreStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.IsZero() && time.Since(s.at) < s.cacheFor {
		return s.rows, nil
	}
	rows, err := s.read(ctx)
	if err != nil {
		return nil, err
	}
	s.rows, s.at = rows, time.Now()
	return rows, nil
}

func (s *snapshotter) read(ctx context.Context) ([]SemaphoreStatus, error) {
	infos, err := s.keys(ctx)
	if err != nil {
		return nil, err
	}
	// Plain and rendered keys hold seats; read them all, a few at a time.
	var lookups []KeyInfo
	templates := map[string]*SemaphoreStatus{}
	var order []string // templates in declaration order
	addTemplate := func(name string, capacity int) *SemaphoreStatus {
		t, ok := templates[name]
		if !ok {
			t = &SemaphoreStatus{Key: name, Capacity: capacity, Holders: []HolderStatus{}, Template: true}
			templates[name] = t
			order = append(order, name)
		}
		return t
	}
	seen := map[string]bool{}
	for _, k := range infos {
		switch {
		case k.Template != "" && k.Template == k.Key:
			addTemplate(k.Key, k.Capacity).Capacity = k.Capacity
		case !seen[k.Key]:
			seen[k.Key] = true
			lookups = append(lookups, k)
		}
	}
	results := make([]SemaphoreStatus, len(lookups))
	errs := make([]error, len(lookups))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(lookupParallelism, len(lookups)) {
		wg.Go(func() {
			for i := range next {
				results[i], errs[i] = s.status(ctx, lookups[i])
			}
		})
	}
	for i := range lookups {
		next <- i
	}
	close(next)
	wg.Wait()

	var rows []SemaphoreStatus
	children := map[string][]SemaphoreStatus{}
	for i, k := range lookups {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if k.Template == "" {
			rows = append(rows, results[i])
			continue
		}
		t := addTemplate(k.Template, k.Capacity)
		t.Keys++
		t.Used += results[i].Used
		if results[i].Used > 0 {
			children[k.Template] = append(children[k.Template], results[i])
		}
	}
	for _, name := range order {
		t := templates[name]
		busy := children[name]
		slices.SortFunc(busy, busiestFirst)
		if len(busy) > s.busiest {
			busy = busy[:s.busiest]
		}
		t.Busiest = busy
		rows = append(rows, *t)
	}
	slices.SortStableFunc(rows, busiestFirst)
	return rows, nil
}

// status reads the holders of one key.
func (s *snapshotter) status(ctx context.Context, k KeyInfo) (SemaphoreStatus, error) {
	hs, err := s.sem.Holders(ctx, k.Key)
	if err != nil {
		return SemaphoreStatus{}, err
	}
	st := SemaphoreStatus{Key: k.Key, Capacity: k.Capacity, Used: len(hs), Holders: make([]HolderStatus, len(hs))}
	for i, h := range hs {
		st.Holders[i] = HolderStatus{PermitID: h.PermitID, TaskID: h.Label, ExpiresAt: h.ExpiresAt.UTC()}
	}
	return st, nil
}
