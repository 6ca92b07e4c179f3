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
	var decls []declaredKey          // every cap, in order, for checkRenderClashes
	defer func() { checkRenderClashes(v, decls) }()
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
				decls = append(decls, declaredKey{field: f, cp: cp, kt: kt})
			}
		}
	}
}

// validate checks one cap at field.
func (cp CapConfig) validate(v *validator, field string) {
	kt, err := ParseKeyTemplate(cp.Key)
	if err != nil {
		v.add(field+".key", "%v", err)
	}
	if cp.Capacity < 1 {
		v.add(field+".capacity", "must be >= 1, got %d", cp.Capacity)
	}
	switch cp.Mode {
	case ModeRequeue, ModeWait:
	default:
		v.add(field+".mode", "must be %q or %q, got %q", ModeRequeue, ModeWait, cp.Mode)
	}
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
	if len(cp.CapacityOverrides) > 0 && kt != nil && !kt.IsTemplate() {
		v.add(field+".capacity_overrides", "only a key template such as \"tenant:{tenant_id}\" can have overrides; key %q is plain", cp.Key)
	}
	for _, k := range slices.Sorted(maps.Keys(cp.CapacityOverrides)) {
		f := fmt.Sprintf("%s.capacity_overrides[%s]", field, strconv.Quote(k))
		if n := cp.CapacityOverrides[k]; n < 1 {
			v.add(f, "must be >= 1, got %d", n)
		}
		if kt != nil && kt.IsTemplate() && !kt.Matches(k) {
			v.add(f, "%q is not a key that template %q renders", k, cp.Key)
		}
	}
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

// declaredKey is one declared cap with its parsed key.
type declaredKey struct {
	field string
	cp    CapConfig
	kt    *KeyTemplate
}

// checkRenderClashes reports two different declared keys that render the
// same semaphore key with different capacities: templates of the same shape
// ("tenant:{tenant_id}" and "tenant:{tenant}"), or a plain key that a
// template renders ("tenant:acme" beside "tenant:{tenant_id}"). Every worker
// must agree on a semaphore's size, or the larger one lets more in.
// Templates of different shapes that can still render one key ("t:{a}" and
// "t:x{b}") are not detected.
func checkRenderClashes(v *validator, decls []declaredKey) {
	for j, b := range decls {
		for _, a := range decls[:j] {
			if a.cp.Key == b.cp.Key {
				continue // checkConsistent compares these
			}
			switch at, bt := a.kt.IsTemplate(), b.kt.IsTemplate(); {
			case at && bt && a.kt.shape() == b.kt.shape():
				if a.cp.Capacity != b.cp.Capacity {
					v.add(b.field+".capacity", "template %q renders the same keys as %q of %s, with capacity %d there but %d here",
						b.cp.Key, a.cp.Key, a.field, a.cp.Capacity, b.cp.Capacity)
				}
				for _, k := range slices.Sorted(maps.Keys(b.cp.CapacityOverrides)) {
					if a.cp.CapacityFor(k) != b.cp.CapacityFor(k) {
						v.add(fmt.Sprintf("%s.capacity_overrides[%s]", b.field, strconv.Quote(k)),
							"key %q has capacity %d under %q of %s but %d here", k, a.cp.CapacityFor(k), a.cp.Key, a.field, b.cp.CapacityFor(k))
					}
				}
				for _, k := range slices.Sorted(maps.Keys(a.cp.CapacityOverrides)) {
					if _, ok := b.cp.CapacityOverrides[k]; !ok && a.cp.CapacityFor(k) != b.cp.CapacityFor(k) {
						v.add(b.field+".capacity_overrides", "%s overrides key %q (capacity %d) but this cap gives it %d",
							a.field, k, a.cp.CapacityFor(k), b.cp.CapacityFor(k))
					}
				}
			case at != bt:
				plain, tmpl := a, b
				if at {
					plain, tmpl = b, a
				}
				if tmpl.kt.Matches(plain.cp.Key) && tmpl.cp.CapacityFor(plain.cp.Key) != plain.cp.Capacity {
					v.add(b.field+".capacity", "key %q has capacity %d in %s, but template %q of %s renders it with capacity %d",
						plain.cp.Key, plain.cp.Capacity, plain.field, tmpl.cp.Key, tmpl.field, tmpl.cp.CapacityFor(plain.cp.Key))
				}
			}
		}
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
