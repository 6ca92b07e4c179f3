package config

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/fleetcap/fleetcap/ratelimit"
)

// RateLimitConfig is one fleet-wide rate limit of a task type (SPEC §2.6):
// a task runs only when it can take Cost tokens of its key, which earns
// Rate tokens every Per, at most Burst at once.
type RateLimitConfig struct {
	// Key names the limit; default the task type. It may be a template
	// over the task's JSON payload such as "stripe:{account_id}", as for
	// caps (see ParseKeyTemplate).
	Key string `yaml:"key"`
	// Rate is the tokens earned every Per (>= 1); required.
	Rate int `yaml:"rate"`
	// Per is the period of Rate, a duration > 0 such as 1s; required.
	Per time.Duration `yaml:"per"`
	// Burst is how many tokens may be taken at once after an idle spell
	// (>= 1); default Rate, also when 0 in code. Keys of rate_overrides
	// keep this burst.
	Burst int `yaml:"burst"`
	// Cost is the tokens one task takes (>= 1, at most Burst); default 1,
	// also when 0 in code.
	Cost int `yaml:"cost"`
	// Mode is requeue or wait, as for caps; default requeue.
	Mode Mode `yaml:"mode"`
	// WaitTimeout is how long mode wait waits for the tokens (> 0: mode
	// requeue is the way not to wait); default 10s, also when 0 in code.
	WaitTimeout time.Duration `yaml:"wait_timeout"`
	// RateOverrides sets the rate of single rendered keys of a templated
	// Key, such as {"stripe:acct_big": 400}, each >= 1; default none.
	RateOverrides map[string]int `yaml:"rate_overrides"`
}

// LimitFor returns the limit of the rendered key: its rate_overrides entry
// if there is one, else Rate, with Per and Burst.
func (c RateLimitConfig) LimitFor(renderedKey string) ratelimit.Limit {
	rate := c.Rate
	if n, ok := c.RateOverrides[renderedKey]; ok {
		rate = n
	}
	return ratelimit.Limit{Rate: rate, Per: c.Per, Burst: c.Burst}
}

// Limit is the limit of the key as declared, before rate_overrides.
func (c RateLimitConfig) Limit() ratelimit.Limit {
	return ratelimit.Limit{Rate: c.Rate, Per: c.Per, Burst: c.Burst}
}

// KeyTemplate parses the limit's key (see ParseKeyTemplate).
func (c RateLimitConfig) KeyTemplate() (*KeyTemplate, error) {
	return ParseKeyTemplate(c.Key)
}

// RenderKey returns the rate-limit key for a task with this payload: the
// key itself, or the key template rendered from the payload. An error
// means the task must not run.
func (c RateLimitConfig) RenderKey(payload []byte) (string, error) {
	kt, err := c.KeyTemplate()
	if err != nil {
		return "", err
	}
	return kt.Render(payload)
}

// withDefaults returns c, the rate limit at path, with its defaults
// applied; typ is the task type (the default key), written as for
// Config.withDefaults.
func (c RateLimitConfig) withDefaults(typ string, written fieldSet, path string) RateLimitConfig {
	if c.Key == "" {
		c.Key = typ
	}
	setDefault(&c.Burst, c.Rate, written, path, "burst")
	setDefault(&c.Cost, 1, written, path, "cost")
	if c.Mode == "" {
		c.Mode = ModeRequeue
	}
	setDefault(&c.WaitTimeout, DefaultWaitTimeout, written, path, "wait_timeout")
	c.RateOverrides = maps.Clone(c.RateOverrides)
	return c
}

// validate checks one rate limit at field.
func (c RateLimitConfig) validate(v *validator, field string) {
	kt, err := ParseKeyTemplate(c.Key)
	if err != nil {
		v.add(field+".key", "%v", err)
	}
	if c.Rate < 1 {
		v.add(field+".rate", "must be >= 1, got %d", c.Rate)
	}
	switch {
	case c.Per == 0:
		v.add(field+".per", "required: a duration > 0 such as 1s")
	case c.Per < 0:
		v.add(field+".per", "must be a duration > 0, got %s", c.Per)
	}
	if c.Burst < 1 {
		v.add(field+".burst", "must be >= 1, got %d", c.Burst)
	}
	switch {
	case c.Cost < 1:
		v.add(field+".cost", "must be >= 1, got %d", c.Cost)
	case c.Cost > c.Burst && c.Burst >= 1:
		v.add(field+".cost", "%d is above burst %d: such a task could never run", c.Cost, c.Burst)
	}
	if c.Rate >= 1 && c.Per > 0 && c.Burst >= 1 {
		if err := c.Limit().Validate(); err != nil {
			v.add(field+".rate", "%v", err)
		}
	}
	switch c.Mode {
	case ModeRequeue, ModeWait:
	default:
		v.add(field+".mode", "must be %q or %q, got %q", ModeRequeue, ModeWait, c.Mode)
	}
	if c.WaitTimeout <= 0 {
		v.add(field+".wait_timeout", "must be a duration > 0, got %s", c.WaitTimeout)
	}
	if len(c.RateOverrides) > 0 && kt != nil && !kt.IsTemplate() {
		v.add(field+".rate_overrides", "only a key template such as \"stripe:{account_id}\" can have overrides; key %q is plain", c.Key)
	}
	for _, k := range slices.Sorted(maps.Keys(c.RateOverrides)) {
		f := fmt.Sprintf("%s.rate_overrides[%s]", field, strconv.Quote(k))
		n := c.RateOverrides[k]
		if n < 1 {
			v.add(f, "must be >= 1, got %d", n)
		} else if err := c.LimitFor(k).Validate(); err != nil && c.Per > 0 && c.Burst >= 1 {
			v.add(f, "%v", err)
		}
		if kt != nil && kt.IsTemplate() && !kt.Matches(k) {
			v.add(f, "%q is not a key that template %q renders", k, c.Key)
		}
	}
}

// validateRateLimits checks the rate limits of every task: each on its own,
// no key twice in one task, and every declaration that can render one key
// with one limit (every worker must agree on a key's rate, or the faster
// one lets more through).
func (c *Config) validateRateLimits(v *validator) {
	var decls []declaredRate
	for _, typ := range c.TaskTypes() {
		inTask := map[string]string{} // key -> field, within this task
		for i, rl := range c.Tasks[typ].RateLimits {
			f := indexPath(taskPath(typ)+".rate_limits", i)
			rl.validate(v, f)
			if prev, dup := inTask[rl.Key]; dup {
				v.add(f+".key", "%q is also the key of %s; a task cannot take tokens of one limit twice (raise cost instead)", rl.Key, prev)
				continue
			}
			inTask[rl.Key] = f
			if kt, err := ParseKeyTemplate(rl.Key); err == nil && rl.Rate >= 1 && rl.Per > 0 {
				decls = append(decls, declaredRate{field: f, rl: rl, kt: kt})
			}
		}
	}
	checkRateClashes(v, decls)
}

// declaredRate is one declared rate limit with its parsed key.
type declaredRate struct {
	field string
	rl    RateLimitConfig
	kt    *KeyTemplate
}

// checkRateClashes reports two declarations that render one key with two
// limits: one key (or template) declared twice, templates of one shape
// ("stripe:{account_id}" and "stripe:{account}"), or a plain key that a
// template renders. As for caps, templates of different shapes that can
// still render one key are not detected.
func checkRateClashes(v *validator, decls []declaredRate) {
	for j, b := range decls {
		for _, a := range decls[:j] {
			at, bt := a.kt.IsTemplate(), b.kt.IsTemplate()
			switch {
			case a.rl.Key == b.rl.Key, at && bt && a.kt.shape() == b.kt.shape():
				if a.rl.Limit() != b.rl.Limit() {
					v.add(b.field+".rate", "key %q is limited to %s here but %s in %s", b.rl.Key, b.rl.Limit(), a.rl.Limit(), a.field)
				}
				for _, k := range slices.Sorted(maps.Keys(mergedKeys(a.rl.RateOverrides, b.rl.RateOverrides))) {
					if la, lb := a.rl.LimitFor(k), b.rl.LimitFor(k); la != lb {
						v.add(fmt.Sprintf("%s.rate_overrides[%s]", b.field, strconv.Quote(k)),
							"key %q is limited to %s here but %s in %s", k, lb, la, a.field)
					}
				}
			case at != bt:
				plain, tmpl := a, b
				if at {
					plain, tmpl = b, a
				}
				if tmpl.kt.Matches(plain.rl.Key) && tmpl.rl.LimitFor(plain.rl.Key) != plain.rl.Limit() {
					v.add(b.field+".rate", "key %q is limited to %s in %s, but template %q of %s renders it with %s",
						plain.rl.Key, plain.rl.Limit(), plain.field, tmpl.rl.Key, tmpl.field, tmpl.rl.LimitFor(plain.rl.Key))
				}
			}
		}
	}
}

// mergedKeys returns a map holding the keys of both.
func mergedKeys(a, b map[string]int) map[string]int {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]int{}
	}
	maps.Copy(out, b)
	return out
}
