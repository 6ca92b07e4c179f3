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
	kt := v.keyTemplate(field, c.Key)
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
	v.mode(field, c.Mode)
	if c.WaitTimeout <= 0 {
		v.add(field+".wait_timeout", "must be a duration > 0, got %s", c.WaitTimeout)
	}
	v.keyOverrides(field+".rate_overrides", kt, c.RateOverrides, "stripe:{account_id}", c.overrideValid)
}

// overrideValid checks the limit that a rate override gives the rendered
// key; a bad per or burst is reported on its own.
func (c RateLimitConfig) overrideValid(renderedKey string) error {
	if c.Per <= 0 || c.Burst < 1 {
		return nil
	}
	return c.LimitFor(renderedKey).Validate()
}

// validateRateLimits checks the rate limits of every task: each on its own,
// no key twice in one task, and every declaration that can render one key
// with one limit (every worker must agree on a key's rate, or the faster
// one lets more through).
func (c *Config) validateRateLimits(v *validator) {
	var decls []declared[RateLimitConfig]
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
				decls = append(decls, declared[RateLimitConfig]{field: f, conf: rl, kt: kt})
			}
		}
	}
	checkOverlaps(v, decls, compareAlikeRates, compareRenderedRate)
}

// compareAlikeRates reports a and then b, one key (or template) declared
// twice or templates of one shape, that give one key two limits.
func compareAlikeRates(v *validator, a, b declared[RateLimitConfig]) {
	if a.conf.Limit() != b.conf.Limit() {
		v.add(b.field+".rate", "key %q is limited to %s here but %s in %s", b.conf.Key, b.conf.Limit(), a.conf.Limit(), a.field)
	}
	for _, k := range slices.Sorted(maps.Keys(mergedKeys(a.conf.RateOverrides, b.conf.RateOverrides))) {
		if la, lb := a.conf.LimitFor(k), b.conf.LimitFor(k); la != lb {
			v.add(fmt.Sprintf("%s.rate_overrides[%s]", b.field, strconv.Quote(k)),
				"key %q is limited to %s here but %s in %s", k, lb, la, a.field)
		}
	}
}

// compareRenderedRate reports at field a plain key that a template renders
// with another limit.
func compareRenderedRate(v *validator, plain, tmpl declared[RateLimitConfig], field string) {
	if limit := tmpl.conf.LimitFor(plain.conf.Key); limit != plain.conf.Limit() {
		v.add(field+".rate", "key %q is limited to %s in %s, but template %q of %s renders it with %s",
			plain.conf.Key, plain.conf.Limit(), plain.field, tmpl.conf.Key, tmpl.field, limit)
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
