package admission

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// Kind says how a limit holds a task back.
type Kind uint8

// The kinds of limits.
const (
	// KindCap is a fleet-wide concurrency cap: the task holds a seat of the
	// key's semaphore while it runs.
	KindCap Kind = iota + 1
	// KindRate is a fleet-wide rate limit: the task spends the key's tokens
	// as it starts.
	KindRate
)

func (k Kind) String() string {
	switch k {
	case KindCap:
		return "cap"
	case KindRate:
		return "rate"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// noun names the kind in messages.
func (k Kind) noun() string {
	if k == KindRate {
		return "rate limit"
	}
	return "semaphore"
}

// Spec is one limit a task type declares in config.yaml: a cap
// (semaphore:, semaphores:) or a rate limit (rate_limits:), its key
// template parsed.
type Spec struct {
	Kind Kind
	Cap  config.CapConfig       // KindCap
	Rate config.RateLimitConfig // KindRate
	tmpl *config.KeyTemplate
}

// Declared is the key as config.yaml declares it: a plain key or a
// template.
func (s Spec) Declared() string { return s.tmpl.String() }

// IsTemplate reports whether the key is a template over the payload.
func (s Spec) IsTemplate() bool { return s.tmpl.IsTemplate() }

// Matches reports whether key is a key the spec's template renders.
func (s Spec) Matches(key string) bool { return s.tmpl.Matches(key) }

// standby is a cap's fleet-wide standby budget for a key of capacity
// seats: how many of its tasks may wait in a worker slot for the next seat
// at once; default the capacity.
func (s Spec) standby(capacity int) int {
	if s.Cap.Standby != nil {
		return *s.Cap.Standby
	}
	return capacity
}

// Limit is one limit of one task: its key rendered from the task's payload,
// and its size in force (an operator's override, else the config's).
type Limit struct {
	Spec
	Key      string
	Template string          // the key's template; "" for a plain key
	Capacity int             // KindCap: seats in force; 0 pauses the key
	Rate     ratelimit.Limit // KindRate: the limit in force

	// Seats (KindCap) is the seats the task takes: the cap's cost, or its
	// payload's cost_from value; 1 when no cost is set. It fits the
	// configured capacity of the key, but may be above the capacity in
	// force when an operator lowered it: the task then waits.
	Seats int
	// Share (KindCap) is the cap's fair_by rendered from the payload: the
	// value whose turn the task waits for; "" without fair_by.
	Share string
	// ShareWeight (KindCap) is the weight of Share (the cap's weights),
	// 1 by default.
	ShareWeight int
	// MaxWaiting (KindCap) is the cap's max_waiting: how many tasks may
	// wait for the key, fleet-wide, before producers refuse more; 0 is no
	// bound.
	MaxWaiting int
}

// Sizes gives the size in force of a rendered key: an operator's override
// of the key or of its template, else the configured one (package
// control's Reader). A nil Sizes is the config's.
type Sizes interface {
	CapacityFor(key, template string, configured int) (int, bool)
	RateFor(key, template string, configured ratelimit.Limit) (ratelimit.Limit, bool)
}

// Table holds the limits every task type of a config declares.
type Table struct {
	byType map[string][]Spec // caps first, then rate limits, as declared
}

// NewTable parses the limits of cfg (defaults applied).
func NewTable(cfg *config.Config) (*Table, error) {
	t := &Table{byType: map[string][]Spec{}}
	for typ, tc := range cfg.Tasks {
		for _, c := range tc.Caps() {
			kt, err := c.KeyTemplate()
			if err != nil {
				return nil, fmt.Errorf("admission: task %q: %w", typ, err)
			}
			t.byType[typ] = append(t.byType[typ], Spec{Kind: KindCap, Cap: c, tmpl: kt})
		}
		for _, rl := range tc.RateLimits {
			kt, err := rl.KeyTemplate()
			if err != nil {
				return nil, fmt.Errorf("admission: task %q: %w", typ, err)
			}
			t.byType[typ] = append(t.byType[typ], Spec{Kind: KindRate, Rate: rl, tmpl: kt})
		}
	}
	return t, nil
}

// Limited reports whether tasks of taskType have any limit.
func (t *Table) Limited(taskType string) bool { return len(t.byType[taskType]) > 0 }

// Types lists the task types that have limits, sorted.
func (t *Table) Types() []string { return slices.Sorted(maps.Keys(t.byType)) }

// For renders the limits of a task of taskType with payload: its caps, then
// its rate limits, each kind sorted by key, so that every task takes them
// in the same order (a task takes tokens last, once it holds its seats, so
// that no token is spent by a task that then does not run). Two caps that
// render one key are one semaphore: one seat of it, of the smaller
// capacity, holds both (the more seats of the two, the tighter
// max_waiting). A payload that cannot render a key, its fair_by or its
// cost is an error that names the template or the field: bad input, the
// task must not run. A cost above the capacity in force (an operator
// lowered it) is not one: Seats stays as configured.
func (t *Table) For(taskType string, payload []byte, sizes Sizes) ([]Limit, error) {
	specs := t.byType[taskType]
	out := make([]Limit, 0, len(specs))
	for _, s := range specs {
		key, err := s.tmpl.Render(payload)
		if err != nil {
			return nil, fmt.Errorf("its payload cannot render its %s key: %w", s.Kind.noun(), err)
		}
		l := Limit{Spec: s, Key: key}
		if s.tmpl.IsTemplate() {
			l.Template = s.tmpl.String()
		}
		if s.Kind == KindCap {
			if err := l.seat(payload); err != nil {
				return nil, err
			}
		}
		l.size(sizes)
		out = append(out, l)
	}
	if len(out) < 2 {
		// The common case, one limit: no sort, whose generic frames
		// would grow the handler goroutine's stack for every task.
		return out, nil
	}
	slices.SortFunc(out, func(a, b Limit) int { return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Key, b.Key)) })
	merged := out[:0]
	for _, l := range out {
		if n := len(merged); n > 0 && l.Kind == KindCap && merged[n-1].Kind == KindCap && merged[n-1].Key == l.Key {
			prev := merged[n-1]
			if l.Capacity < prev.Capacity {
				merged[n-1] = l
			}
			merged[n-1].Seats = max(l.Seats, prev.Seats)
			merged[n-1].MaxWaiting = tighterBound(l.MaxWaiting, prev.MaxWaiting)
			continue
		}
		merged = append(merged, l)
	}
	return merged, nil
}

// seat sets what the cap l asks of its key for a task of payload: its
// seats (against the key's configured capacity), its fair share value and
// weight, and the bound on waiting.
func (l *Limit) seat(payload []byte) error {
	seats, err := l.Cap.CostOf(payload, l.Cap.CapacityFor(l.Key))
	if err != nil {
		return fmt.Errorf("its payload cannot give its seats of semaphore %q: %w", l.Key, err)
	}
	share, err := l.Cap.FairValue(payload)
	if err != nil {
		return fmt.Errorf("its payload cannot render the fair share of semaphore %q: %w", l.Key, err)
	}
	l.Seats, l.Share, l.ShareWeight, l.MaxWaiting = seats, share, l.Cap.WeightOf(share), l.Cap.MaxWaiting
	return nil
}

// tighterBound is the smaller of two max_waiting bounds, where 0 is none.
func tighterBound(a, b int) int {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// lineOptions place a task's token in its cap's line: in its fair share's
// turn, when the cap has fair_by.
func (l Limit) lineOptions() []semaphore.AcquireOption {
	if l.Kind != KindCap || l.Cap.FairBy == "" {
		return nil
	}
	return []semaphore.AcquireOption{semaphore.WithShare(l.Share, max(l.ShareWeight, 1))}
}

// tokenOptions are lineOptions, and WithNewToken for a token that is new
// to the rooms (fresh).
func (l Limit) tokenOptions(fresh bool) []semaphore.AcquireOption {
	opts := l.lineOptions()
	if fresh {
		opts = append(opts, semaphore.WithNewToken())
	}
	return opts
}

// size sets the size in force of l's key.
func (l *Limit) size(sizes Sizes) {
	switch l.Kind {
	case KindCap:
		l.Capacity = l.Cap.CapacityFor(l.Key)
		if sizes != nil {
			l.Capacity, _ = sizes.CapacityFor(l.Key, l.Template, l.Capacity)
		}
	case KindRate:
		l.Rate = l.Spec.Rate.LimitFor(l.Key)
		if sizes != nil {
			l.Rate, _ = sizes.RateFor(l.Key, l.Template, l.Rate)
		}
	}
}

// Resized is l with its size in force read again (an override may have
// changed it since l was rendered).
func (l Limit) Resized(sizes Sizes) Limit {
	l.size(sizes)
	return l
}

// Plain are the declared limits of kind whose key is not a template, by
// key (the first declaration of each).
func (t *Table) Plain(kind Kind) map[string]Spec { return t.declared(kind, false) }

// Templates are the declared limits of kind whose key is a template, by
// template (the first declaration of each).
func (t *Table) Templates(kind Kind) map[string]Spec { return t.declared(kind, true) }

func (t *Table) declared(kind Kind, templates bool) map[string]Spec {
	out := map[string]Spec{}
	for _, specs := range t.byType {
		for _, s := range specs {
			if _, seen := out[s.Declared()]; !seen && s.Kind == kind && s.IsTemplate() == templates {
				out[s.Declared()] = s
			}
		}
	}
	return out
}

// Caps lists every declared cap key and template once, sorted, with the
// first declaration of each.
func (t *Table) Caps() []Spec {
	seen := map[string]Spec{}
	for _, specs := range t.byType {
		for _, s := range specs {
			if _, ok := seen[s.Declared()]; !ok && s.Kind == KindCap {
				seen[s.Declared()] = s
			}
		}
	}
	out := slices.Collect(maps.Values(seen))
	slices.SortFunc(out, func(a, b Spec) int { return cmp.Compare(a.Declared(), b.Declared()) })
	return out
}

// CapTemplateOf returns the cap template that renders key, or key itself
// when it is a declared plain key or no template renders it. Plain keys
// win, then templates in key order.
func (t *Table) CapTemplateOf(key string) string {
	var tmpls []string
	for _, s := range t.Caps() {
		switch {
		case !s.IsTemplate() && s.Declared() == key:
			return key
		case s.IsTemplate() && s.Matches(key):
			tmpls = append(tmpls, s.Declared())
		}
	}
	if len(tmpls) == 0 {
		return key
	}
	return tmpls[0]
}
