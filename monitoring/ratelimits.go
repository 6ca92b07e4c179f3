package monitoring

import (
	"cmp"
	"context"

	"github.com/fleetcap/fleetcap/ratelimit"
)

// RateKeyInfo is a rate-limit key the monitoring server shows, as the
// worker declares it.
type RateKeyInfo struct {
	// Key is a declared key, a declared template or a rendered key, and
	// Template says which, as in KeyInfo.
	Key      string
	Template string
	// Limit is the configured limit (for a rendered key: after
	// rate_overrides; for a template: that of its rendered keys).
	Limit ratelimit.Limit
	// MaxCost is the most tokens one task of any type takes of the key: a
	// runtime burst below it is refused, as such a task could never run.
	MaxCost int
}

// RateSpec is a limit as the API writes and reads it: {"rate": 100, "per":
// "1s", "burst": 20}.
type RateSpec struct {
	Rate  int    `json:"rate"`
	Per   string `json:"per"`
	Burst int    `json:"burst"`
}

func specOf(l ratelimit.Limit) RateSpec {
	return RateSpec{Rate: l.Rate, Per: l.Per.String(), Burst: l.Burst}
}

// RateLimitStatus is one row of GET /api/semaphores of kind "rate".
type RateLimitStatus struct {
	Kind string `json:"kind"` // KindRate
	Key  string `json:"key"`
	// RateSpec is the limit in force: a runtime override, else Configured.
	RateSpec
	Configured RateSpec `json:"configured"`
	Override   bool     `json:"override"`
	// Remaining is how many tokens may be taken now (absent on a template
	// row).
	Remaining *int `json:"remaining,omitempty"`
	// Waiting is how many tasks wait in the key's room for their tokens
	// (held back by a producer, or sent back by a worker); a template's
	// row sums its rendered keys that the worker listed.
	Waiting int `json:"waiting"`

	// Template rows only, as for SemaphoreStatus: the rendered keys the
	// worker listed, and the busiest of those in use (fewest tokens left).
	Template bool              `json:"template,omitempty"`
	Keys     int               `json:"keys,omitempty"`
	Busiest  []RateLimitStatus `json:"busiest,omitempty"`
}

// spent is the share of the burst in use, for ordering busiest first.
func (r RateLimitStatus) spent() float64 {
	if r.Template {
		if len(r.Busiest) == 0 {
			return 0
		}
		return r.Busiest[0].spent()
	}
	return 1 - float64(*r.Remaining)/float64(r.Burst)
}

func busiestRateFirst(a, b RateLimitStatus) int {
	if c := cmp.Compare(b.spent(), a.spent()); c != 0 {
		return c
	}
	return cmp.Compare(a.Key, b.Key)
}

// limitFor is the limit in force of a key rendered from template ("" for a
// plain key) whose config gives it configured.
func (s *snapshotter) limitFor(key, template string, configured ratelimit.Limit) (ratelimit.Limit, bool) {
	if s.overrides == nil {
		return configured, false
	}
	return s.overrides.RateFor(key, template, configured)
}

// rateRow is the row of one key without its remaining tokens.
func (s *snapshotter) rateRow(k RateKeyInfo, template string) RateLimitStatus {
	limit, over := s.limitFor(k.Key, template, k.Limit)
	return RateLimitStatus{Kind: KindRate, Key: k.Key, RateSpec: specOf(limit), Configured: specOf(k.Limit), Override: over}
}

// rateTemplateRow is the row of the template name whose rendered keys have
// the configured limit.
func (s *snapshotter) rateTemplateRow(name string, configured ratelimit.Limit) RateLimitStatus {
	row := s.rateRow(RateKeyInfo{Key: name, Limit: configured}, name)
	row.Template = true
	return row
}

// inUse reports whether some of the key's tokens are taken, or tasks wait
// for them.
func (r RateLimitStatus) inUse() bool { return *r.Remaining < r.Burst || r.Waiting > 0 }

// count counts one of a template's rendered keys in the template's row.
func (r *RateLimitStatus) count(rendered RateLimitStatus) {
	r.Keys++
	r.Waiting += rendered.Waiting
}

// setBusiest sets the rendered keys listed beneath a template's row.
func (r *RateLimitStatus) setBusiest(rendered []RateLimitStatus) { r.Busiest = rendered }

// readRates reads the remaining tokens and the tasks waiting of every
// listed plain and rendered rate-limit key, and returns the rows busiest
// first, templates with their busiest rendered keys beneath.
func (s *snapshotter) readRates(ctx context.Context) ([]RateLimitStatus, error) {
	if s.limiter == nil {
		return nil, nil
	}
	infos, err := s.rateKeys(ctx)
	if err != nil {
		return nil, err
	}
	rows := newTemplateRows[RateLimitStatus]()
	lookups, templates := splitKeys(infos)
	for _, k := range templates {
		rows.setTemplate(k.Key, s.rateTemplateRow(k.Key, k.Limit)) // the template's own entry wins
	}
	results, err := inParallel(len(lookups), func(i int) (RateLimitStatus, error) {
		k := lookups[i]
		row := s.rateRow(k, k.Template)
		limit, _ := s.limitFor(k.Key, k.Template, k.Limit)
		res, err := s.limiter.Peek(ctx, k.Key, limit, 1)
		if err != nil {
			return RateLimitStatus{}, err
		}
		row.Remaining = &res.Remaining
		if row.Waiting, err = s.sem.PacedRooms(false).Waiting(ctx, k.Key); err != nil {
			return RateLimitStatus{}, err
		}
		return row, nil
	})
	if err != nil {
		return nil, err
	}
	for i, k := range lookups {
		rows.add(k.Template, results[i], func() RateLimitStatus { return s.rateTemplateRow(k.Template, k.Limit) })
	}
	return rows.sorted(s.busiest, busiestRateFirst), nil
}

// inParallel calls fn(0..n-1), lookupParallelism at a time, and returns
// the results in order, or the first error by index.
func inParallel[T any](n int, fn func(i int) (T, error)) ([]T, error) {
	results := make([]T, n)
	errs := make([]error, n)
	next := make(chan int)
	done := make(chan struct{})
	workers := min(lookupParallelism, n)
	for range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range next {
				results[i], errs[i] = fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	for range workers {
		<-done
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return results, nil
}
