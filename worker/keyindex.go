package worker

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/ratelimit"
)

// DeclaredRateKey is a rate-limit key the config declares (a plain key or a
// template), or a key rendered from a declared template.
type DeclaredRateKey struct {
	Key      string
	Template string          // the template of a rendered key; equal to Key for the template itself; "" for a plain key
	Limit    ratelimit.Limit // as configured: for a rendered key after rate_overrides
	MaxCost  int             // the most tokens one task of any type takes of the key
}

// KeyIndex answers which semaphore and rate-limit keys a config declares,
// for the monitoring server (its rows and the override API, which takes a
// plain key, a template or a key a template renders) and for the metrics'
// labels. Build it with NewKeyIndex once the config is final; it does not
// follow later SetCaps calls. It is safe for concurrent use.
type KeyIndex struct {
	caps  []indexedCap  // plain keys first, then templates, each in key order
	rates []indexedRate // likewise
	tasks []TaskKey     // by task type, then caps before rate limits in declaration order
}

// TaskKey is a key a task type uses: one of its caps' keys or templates,
// or one of its rate limits'. The metrics create the series of the pair at
// start (see TaskKeys).
type TaskKey struct {
	TaskType string
	Key      string
	Rate     bool // a rate limit's key, not a cap's
	// Reasons are the reasons a task of the type may go back to its queue
	// on the key (see RequeueError.Key).
	Reasons []RequeueReason
}

// The reasons a task goes back on a cap's key, and on a rate limit's.
var (
	capRequeueReasons  = []RequeueReason{RequeueFull, RequeueTimeout, RequeueShutdown, RequeueLeaseLost, RequeueStoreError}
	rateRequeueReasons = []RequeueReason{RequeueRateLimited, RequeueStoreError}
)

type indexedCap struct {
	cfg CapConfig
	kt  *config.KeyTemplate
}

type indexedRate struct {
	cfg     RateLimitConfig
	kt      *config.KeyTemplate
	maxCost int
}

// NewKeyIndex indexes the caps and rate limits of cfg (defaults applied,
// as LoadConfig returns it).
func NewKeyIndex(cfg *Config) (*KeyIndex, error) {
	x := &KeyIndex{}
	seenCap := map[string]bool{}
	rateAt := map[string]int{}
	for _, typ := range cfg.TaskTypes() {
		t := cfg.Tasks[typ]
		for _, c := range t.Caps() {
			if c.Key == "" {
				c.Key = typ
			}
			x.tasks = append(x.tasks, TaskKey{TaskType: typ, Key: c.Key, Reasons: slices.Clone(capRequeueReasons)})
			if seenCap[c.Key] {
				continue
			}
			seenCap[c.Key] = true
			kt, err := c.KeyTemplate()
			if err != nil {
				return nil, fmt.Errorf("worker: task %q: %w", typ, err)
			}
			x.caps = append(x.caps, indexedCap{cfg: c, kt: kt})
		}
		for _, rl := range t.RateLimits {
			x.tasks = append(x.tasks, TaskKey{TaskType: typ, Key: rl.Key, Rate: true, Reasons: slices.Clone(rateRequeueReasons)})
			if i, ok := rateAt[rl.Key]; ok {
				x.rates[i].maxCost = max(x.rates[i].maxCost, rl.Cost)
				continue
			}
			kt, err := rl.KeyTemplate()
			if err != nil {
				return nil, fmt.Errorf("worker: task %q: %w", typ, err)
			}
			rateAt[rl.Key] = len(x.rates)
			x.rates = append(x.rates, indexedRate{cfg: rl, kt: kt, maxCost: rl.Cost})
		}
	}
	slices.SortFunc(x.caps, func(a, b indexedCap) int { return compareDecl(a.kt, b.kt) })
	slices.SortFunc(x.rates, func(a, b indexedRate) int { return compareDecl(a.kt, b.kt) })
	return x, nil
}

// compareDecl orders plain keys before templates, each by key.
func compareDecl(a, b *config.KeyTemplate) int {
	if at, bt := a.IsTemplate(), b.IsTemplate(); at != bt {
		if at {
			return 1
		}
		return -1
	}
	return strings.Compare(a.String(), b.String())
}

// LookupCap resolves a semaphore key: a declared plain key, a declared
// template (Template == Key), or a key a declared template renders (with
// its capacity after capacity_overrides). A plain key wins over a
// template that renders it, and of several templates the first by key.
func (x *KeyIndex) LookupCap(key string) (DeclaredKey, bool) {
	for _, c := range x.caps {
		switch {
		case c.cfg.Key == key && !c.kt.IsTemplate():
			return DeclaredKey{Key: key, Capacity: c.cfg.Capacity}, true
		case c.cfg.Key == key:
			return DeclaredKey{Key: key, Capacity: c.cfg.Capacity, Template: key}, true
		}
	}
	for _, c := range x.caps {
		if c.kt.IsTemplate() && c.kt.Matches(key) {
			return DeclaredKey{Key: key, Capacity: c.cfg.CapacityFor(key), Template: c.cfg.Key}, true
		}
	}
	return DeclaredKey{}, false
}

// TaskKeys lists, for each task type, the keys of its caps and rate
// limits, with the reasons its tasks may go back on each.
func (x *KeyIndex) TaskKeys() []TaskKey { return slices.Clone(x.tasks) }

// RateKeys lists the declared rate-limit keys and templates: plain keys
// first, then templates, each in key order.
func (x *KeyIndex) RateKeys() []DeclaredRateKey {
	out := make([]DeclaredRateKey, len(x.rates))
	for i, r := range x.rates {
		out[i] = r.declared(r.cfg.Key)
	}
	return out
}

// LookupRate resolves a rate-limit key as LookupCap resolves a semaphore
// key. MaxCost is the most any task type takes of the key (for a rendered
// key: of the template that renders it).
func (x *KeyIndex) LookupRate(key string) (DeclaredRateKey, bool) {
	for _, r := range x.rates {
		if r.cfg.Key == key {
			return r.declared(key), true
		}
	}
	for _, r := range x.rates {
		if r.kt.IsTemplate() && r.kt.Matches(key) {
			return r.declared(key), true
		}
	}
	return DeclaredRateKey{}, false
}

func (r indexedRate) declared(key string) DeclaredRateKey {
	d := DeclaredRateKey{Key: key, Limit: r.cfg.LimitFor(key), MaxCost: r.maxCost}
	if r.kt.IsTemplate() {
		d.Template = r.cfg.Key
	}
	return d
}

// RateKeyLabel names a rate-limit key for metrics: the template a rendered
// key comes from, so that per-account keys do not make one series each;
// other keys as they are.
func (x *KeyIndex) RateKeyLabel(key string) string {
	if d, ok := x.LookupRate(key); ok && d.Template != "" {
		return d.Template
	}
	return key
}
