package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcap/fleetcap/internal/rediskey"
)

// validate checks a config with its defaults applied. It reports every
// problem, each naming its field by YAML path, joined with errors.Join.
func (c *Config) validate() error {
	return errors.Join(asErrors(c.fieldErrors(nil))...)
}

// fieldErrors returns every validation problem of the config; written is
// the fields its file wrote (nil for a Config built in code), so that a 0
// written where 0 stands for "none" is an error too.
func (c *Config) fieldErrors(written fieldSet) []fieldError {
	v := &validator{written: written}
	c.validateRedis(v)
	c.validateWorker(v)
	c.validateSemaphore(v)
	c.validateMonitoring(v)
	c.validateTasks(v)
	c.validateRateLimits(v)
	return v.errs
}

// validator collects field errors.
type validator struct {
	errs    []fieldError
	written fieldSet // the fields the file wrote; nil in code
}

// wrote reports whether the file wrote the field at path, so that a 0
// there is not mistaken for a field left out.
func (v *validator) wrote(path string) bool { return v.written[path] }

func (v *validator) add(field, format string, args ...any) {
	v.errs = append(v.errs, fieldError{path: field, msg: fmt.Sprintf(format, args...)})
}

// keyTemplate parses the key of the cap or rate limit at field, and
// reports it at field+".key" when it does not parse (nil then).
func (v *validator) keyTemplate(field, key string) *KeyTemplate {
	kt, err := ParseKeyTemplate(key)
	if err != nil {
		v.add(field+".key", "%v", err)
	}
	return kt
}

// mode checks the mode m of the cap or rate limit at field.
func (v *validator) mode(field string, m Mode) {
	switch m {
	case ModeRequeue, ModeWait:
	default:
		v.add(field+".mode", "must be %q or %q, got %q", ModeRequeue, ModeWait, m)
	}
}

// keyOverrides checks the overrides of single rendered keys at field
// (capacity_overrides or rate_overrides) of a cap or rate limit whose key
// parsed as kt (nil: it did not parse, which is reported already): only a
// template has them, such as example; each is >= 1, and each key is one
// the template renders. check, if not nil, checks an override >= 1
// further.
func (v *validator) keyOverrides(field string, kt *KeyTemplate, overrides map[string]int, example string, check func(renderedKey string) error) {
	if len(overrides) > 0 && kt != nil && !kt.IsTemplate() {
		v.add(field, "only a key template such as %q can have overrides; key %q is plain", example, kt.String())
	}
	for _, k := range slices.Sorted(maps.Keys(overrides)) {
		f := fmt.Sprintf("%s[%s]", field, strconv.Quote(k))
		if n := overrides[k]; n < 1 {
			v.add(f, "must be >= 1, got %d", n)
		} else if check != nil {
			if err := check(k); err != nil {
				v.add(f, "%v", err)
			}
		}
		if kt != nil && kt.IsTemplate() && !kt.Matches(k) {
			v.add(f, "%q is not a key that template %q renders", k, kt.String())
		}
	}
}

func (c *Config) validateRedis(v *validator) {
	r := c.Redis
	if r.URL != "" && len(r.ClusterAddrs) > 0 {
		v.add("redis", "set either url (or %s) or cluster_addrs, not both", EnvRedisURL)
	}
	if r.URL != "" {
		if _, err := parseRedisURL(r.URL); err != nil {
			v.add("redis.url", "%v", err)
		}
	}
	if len(r.ClusterAddrs) > 0 {
		var serr *seedError
		if _, err := parseClusterSeeds(r.ClusterAddrs); errors.As(err, &serr) {
			v.add(fmt.Sprintf("redis.cluster_addrs[%d]", serr.index), "%v", serr.err)
		} else if err != nil {
			v.add("redis.cluster_addrs", "%v", err)
		}
	}
	if t, err := r.endpoint(); err == nil { // endpoint errors are reported above
		var ferr *tlsFileError
		if err := t.loadTLSFiles(r.TLS); errors.As(err, &ferr) {
			v.add(strings.TrimSuffix("redis.tls."+ferr.field, "."), "%v", ferr.err)
		}
	}
	if r.Embedded() {
		if err := checkHostPort(r.EmbeddedAddr, 1); err != nil {
			v.add("redis.embedded_addr", "%v", err)
		}
	}
}

func (c *Config) validateWorker(v *validator) {
	w := c.Worker
	if w.Concurrency < 1 {
		v.add("worker.concurrency", "must be >= 1, got %d", w.Concurrency)
	}
	for _, q := range slices.Sorted(maps.Keys(w.Queues)) {
		field := fmt.Sprintf("worker.queues[%s]", strconv.Quote(q))
		if strings.TrimSpace(q) == "" {
			v.add(field, "queue name must not be empty")
		}
		if p := w.Queues[q]; p < 1 {
			v.add(field, "priority must be >= 1, got %d", p)
		}
	}
	if w.ShutdownTimeout <= 0 {
		v.add("worker.shutdown_timeout", "must be a duration > 0, got %s", w.ShutdownTimeout)
	}
	if w.TaskCheckInterval < time.Millisecond {
		v.add("worker.task_check_interval", "must be at least 1ms, got %s", w.TaskCheckInterval)
	}
	if w.ParkedRetry < time.Second {
		v.add("worker.parked_retry", "must be at least 1s, got %s", w.ParkedRetry)
	}
	if w.DelayedTaskCheckInterval < 100*time.Millisecond {
		v.add("worker.delayed_task_check_interval", "must be at least 100ms, got %s", w.DelayedTaskCheckInterval)
	}
}

func (c *Config) validateSemaphore(v *validator) {
	s := c.Semaphore
	if err := rediskey.CheckPrefix(s.Prefix); err != nil {
		v.add("semaphore.prefix", "%v", err)
	}
	if s.DefaultTTL < minTTL {
		v.add("semaphore.default_ttl", "must be at least %s, got %s", minTTL, s.DefaultTTL)
	}
}

func (c *Config) validateMonitoring(v *validator) {
	// Port 0 picks a free port (the worker prints where its pages are).
	if err := checkHostPort(c.Monitoring.Addr, 0); err != nil {
		v.add("monitoring.addr", "%v", err)
	}
}

// minTTL is the shortest lease: Redis expires keys in milliseconds.
const minTTL = time.Millisecond

// declaredCap remembers where a key's capacity was first declared, and
// the rest that every declaration of the key must agree on.
type declaredCap struct {
	field     string
	capacity  int
	overrides map[string]int
	cp        CapConfig
}

func (c *Config) validateTasks(v *validator) {
	keys := map[string]declaredCap{} // key or key template -> first declaration
	var decls []declared[CapConfig]  // every cap, in order, for checkOverlaps
	defer func() { checkOverlaps(v, decls, compareAlikeCaps, compareRenderedCap) }()
	for _, typ := range c.TaskTypes() {
		t := c.Tasks[typ]
		field := taskPath(typ)
		if strings.TrimSpace(typ) == "" {
			v.add(field, "task type must not be empty")
		}
		if _, ok := c.Worker.Queues[t.Queue]; !ok {
			v.add(field+".queue", "%q is not one of worker.queues %q", t.Queue, slices.Sorted(maps.Keys(c.Worker.Queues)))
		}
		if t.MaxRetry != nil && *t.MaxRetry < 0 {
			v.add(field+".max_retry", "must be >= 0, got %d", *t.MaxRetry)
		}
		if t.Timeout <= 0 {
			v.add(field+".timeout", "must be a duration > 0, got %s", t.Timeout)
		}
		if t.Semaphore != nil && len(t.Semaphores) > 0 {
			v.add(field, "set either semaphore or semaphores, not both")
		}

		var capFields []string
		if t.Semaphore != nil {
			capFields = append(capFields, field+".semaphore")
		}
		for i := range t.Semaphores {
			capFields = append(capFields, indexPath(field+".semaphores", i))
		}
		inTask := map[string]string{} // key -> field, within this task
		// The caps as withDefaults left them: Caps would fill a 0 the
		// file wrote.
		for i, cp := range t.declaredCaps() {
			f := capFields[i]
			cp.validate(v, f)
			if prev, dup := inTask[cp.Key]; dup {
				v.add(f+".key", "%q is also the key of %s; a task cannot hold two seats of one semaphore", cp.Key, prev)
				continue
			}
			inTask[cp.Key] = f
			checkConsistent(v, keys, f, cp)
			if kt, err := ParseKeyTemplate(cp.Key); err == nil && cp.Capacity >= 1 {
				decls = append(decls, declared[CapConfig]{field: f, conf: cp, kt: kt})
			}
		}
	}
}

// validate checks one cap at field.
func (cp CapConfig) validate(v *validator, field string) {
	kt := v.keyTemplate(field, cp.Key)
	if cp.Capacity < 1 {
		v.add(field+".capacity", "must be >= 1, got %d", cp.Capacity)
	}
	v.mode(field, cp.Mode)
	if cp.TTL < minTTL {
		v.add(field+".ttl", "must be at least %s, got %s", minTTL, cp.TTL)
	}
	if cp.WaitTimeout <= 0 {
		v.add(field+".wait_timeout", "must be a duration > 0, got %s", cp.WaitTimeout)
	}
	if cp.Standby != nil && *cp.Standby < 0 {
		v.add(field+".standby", "must not be negative, got %d", *cp.Standby)
	}
	switch cp.OnLeaseLost {
	case LeaseLostCancel, LeaseLostContinue:
	default:
		v.add(field+".on_lease_lost", "must be %q or %q, got %q", LeaseLostCancel, LeaseLostContinue, cp.OnLeaseLost)
	}
	v.keyOverrides(field+".capacity_overrides", kt, cp.CapacityOverrides, "tenant:{tenant_id}", nil)
	cp.validateFairShare(v, field)
	cp.validateCost(v, field)
	if cp.MaxWaiting < 0 || cp.MaxWaiting == 0 && v.wrote(field+".max_waiting") {
		v.add(field+".max_waiting", "must be >= 1 (leave it out for no bound), got %d", cp.MaxWaiting)
	}
}

// validateFairShare checks the cap's fair_by and weights at field.
func (cp CapConfig) validateFairShare(v *validator, field string) {
	var fair *KeyTemplate
	if cp.FairBy != "" {
		kt, err := ParseKeyTemplate(cp.FairBy)
		switch {
		case err != nil:
			v.add(field+".fair_by", "not a valid template: %v", err)
		case !kt.IsTemplate():
			v.add(field+".fair_by", "%q names no payload field; want a template such as \"{tenant_id}\"", cp.FairBy)
		default:
			fair = kt
		}
	}
	if len(cp.Weights) > 0 && cp.FairBy == "" {
		v.add(field+".weights", "set without fair_by: a weight is that of a fair_by value")
	}
	for _, k := range slices.Sorted(maps.Keys(cp.Weights)) {
		f := fmt.Sprintf("%s.weights[%s]", field, strconv.Quote(k))
		if n := cp.Weights[k]; n < 1 {
			v.add(f, "must be >= 1, got %d", n)
		}
		if fair != nil && !fair.Matches(k) {
			v.add(f, "%q is not a value that fair_by %q renders", k, cp.FairBy)
		}
	}
}

// validateCost checks the cap's cost and cost_from at field: one of them,
// and a cost that fits the capacity of every key the cap renders.
func (cp CapConfig) validateCost(v *validator, field string) {
	if cp.CostFrom != "" {
		if cp.Cost != 0 || v.wrote(field+".cost") {
			v.add(field+".cost", "set either cost or cost_from, not both")
		}
		if _, err := parseFieldPath(cp.CostFrom); err != nil {
			v.add(field+".cost_from", "%q is not a dotted payload field path such as \"pages\" or \"job.pages\": %v", cp.CostFrom, err)
		}
		return
	}
	switch {
	case cp.Cost < 1:
		v.add(field+".cost", "must be >= 1, got %d", cp.Cost)
	case cp.Cost > cp.Capacity && cp.Capacity >= 1:
		v.add(field+".cost", "%d is above capacity %d: such a task could never run", cp.Cost, cp.Capacity)
	}
	for _, k := range slices.Sorted(maps.Keys(cp.CapacityOverrides)) {
		if n := cp.CapacityOverrides[k]; cp.Cost > n && n >= 1 {
			v.add(field+".cost", "%d is above capacity %d of key %q (capacity_overrides): such a task could never run", cp.Cost, n, k)
		}
	}
}

// checkConsistent reports a key (or key template) declared twice with
// different capacities: every worker must agree on a semaphore's size.
func checkConsistent(v *validator, keys map[string]declaredCap, field string, cp CapConfig) {
	prev, seen := keys[cp.Key]
	if !seen {
		keys[cp.Key] = declaredCap{field: field, capacity: cp.Capacity, overrides: cp.CapacityOverrides, cp: cp}
		return
	}
	// The waiting for a key is one: one order and one bound for all its
	// tasks (cost is the task's own).
	if prev.cp.FairBy != cp.FairBy {
		v.add(field+".fair_by", "key %q has fair_by %q here but %q in %s", cp.Key, cp.FairBy, prev.cp.FairBy, prev.field)
	} else if !maps.Equal(prev.cp.Weights, cp.Weights) {
		v.add(field+".weights", "key %q has other weights in %s", cp.Key, prev.field)
	}
	if prev.cp.MaxWaiting != cp.MaxWaiting {
		v.add(field+".max_waiting", "key %q has max_waiting %d here but %d in %s (0: none)", cp.Key, cp.MaxWaiting, prev.cp.MaxWaiting, prev.field)
	}
	if prev.capacity != cp.Capacity {
		v.add(field+".capacity", "key %q has capacity %d here but %d in %s", cp.Key, cp.Capacity, prev.capacity, prev.field)
	}
	for _, k := range slices.Sorted(maps.Keys(cp.CapacityOverrides)) {
		if n, ok := prev.overrides[k]; !ok || n != cp.CapacityOverrides[k] {
			v.add(fmt.Sprintf("%s.capacity_overrides[%s]", field, strconv.Quote(k)), "key %q has a different capacity override in %s", k, prev.field)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(prev.overrides)) {
		if _, ok := cp.CapacityOverrides[k]; !ok {
			v.add(field+".capacity_overrides", "%s overrides key %q but this cap does not", prev.field, k)
		}
	}
}

// declared is one declaration of a cap or rate limit (C is CapConfig or
// RateLimitConfig) at field, with its key parsed.
type declared[C any] struct {
	field string
	conf  C
	kt    *KeyTemplate
}

// checkOverlaps compares every two declarations whose keys render one key:
// every worker must agree on a key's capacity or limit, or the larger one
// lets more in. alike compares a with b, declared after it, where both
// declare one key (or template) or templates of one shape ("tenant:{id}"
// and "tenant:{tenant}"); rendered compares plain, a plain key, with tmpl,
// a template that renders it, and reports at field, that of the later of
// the two. Templates of different shapes that can still render one key
// ("t:{a}" and "t:x{b}") are not detected.
func checkOverlaps[C any](v *validator, decls []declared[C],
	alike func(v *validator, a, b declared[C]),
	rendered func(v *validator, plain, tmpl declared[C], field string),
) {
	for j, b := range decls {
		for _, a := range decls[:j] {
			at, bt := a.kt.IsTemplate(), b.kt.IsTemplate()
			switch {
			case a.kt.String() == b.kt.String(), at && bt && a.kt.shape() == b.kt.shape():
				alike(v, a, b)
			case at != bt:
				plain, tmpl := a, b
				if at {
					plain, tmpl = b, a
				}
				if tmpl.kt.Matches(plain.kt.String()) {
					rendered(v, plain, tmpl, b.field)
				}
			}
		}
	}
}

// compareAlikeCaps reports two templates of one shape, a and then b, that
// render one key with two capacities. A key declared twice is
// checkConsistent's to compare.
func compareAlikeCaps(v *validator, a, b declared[CapConfig]) {
	if a.conf.Key == b.conf.Key {
		return
	}
	if a.conf.Capacity != b.conf.Capacity {
		v.add(b.field+".capacity", "template %q renders the same keys as %q of %s, with capacity %d there but %d here",
			b.conf.Key, a.conf.Key, a.field, a.conf.Capacity, b.conf.Capacity)
	}
	for _, k := range slices.Sorted(maps.Keys(b.conf.CapacityOverrides)) {
		if a.conf.CapacityFor(k) != b.conf.CapacityFor(k) {
			v.add(fmt.Sprintf("%s.capacity_overrides[%s]", b.field, strconv.Quote(k)),
				"key %q has capacity %d under %q of %s but %d here", k, a.conf.CapacityFor(k), a.conf.Key, a.field, b.conf.CapacityFor(k))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(a.conf.CapacityOverrides)) {
		if _, ok := b.conf.CapacityOverrides[k]; !ok && a.conf.CapacityFor(k) != b.conf.CapacityFor(k) {
			v.add(b.field+".capacity_overrides", "%s overrides key %q (capacity %d) but this cap gives it %d",
				a.field, k, a.conf.CapacityFor(k), b.conf.CapacityFor(k))
		}
	}
}

// compareRenderedCap reports at field a plain key that a template renders
// with another capacity.
func compareRenderedCap(v *validator, plain, tmpl declared[CapConfig], field string) {
	if n := tmpl.conf.CapacityFor(plain.conf.Key); n != plain.conf.Capacity {
		v.add(field+".capacity", "key %q has capacity %d in %s, but template %q of %s renders it with capacity %d",
			plain.conf.Key, plain.conf.Capacity, plain.field, tmpl.conf.Key, tmpl.field, n)
	}
}

// checkHostPort checks a host:port address.
func checkHostPort(addr string, minPort int) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port, got %q", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < minPort || n > 65535 {
		return fmt.Errorf("port must be a number in %d..65535, got %q", minPort, port)
	}
	return nil
}
