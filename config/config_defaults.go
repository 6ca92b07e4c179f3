package config

import (
	"maps"
	"time"
)

// ApplyDefaults fills the unset fields of a Config built in code with their
// defaults, as Validate does, without checking it: there a field that is 0
// (or nil) is unset (see Config).
func (c *Config) ApplyDefaults() {
	c.withDefaults(nil)
}

// withDefaults fills every unset field with its documented default. A
// field is unset when it holds its zero value and written, the fields a
// config file wrote (nil for a Config built in code), does not hold it: a
// 0 the file wrote stays, for validate to judge. It is idempotent, and
// copies what it changes rather than writing through pointers the caller
// may share.
func (c *Config) withDefaults(written fieldSet) {
	if c.Redis.EmbeddedAddr == "" {
		c.Redis.EmbeddedAddr = DefaultEmbeddedAddr
	}

	setDefault(&c.Worker.Concurrency, DefaultConcurrency, written, "worker", "concurrency")
	if len(c.Worker.Queues) == 0 {
		c.Worker.Queues = map[string]int{DefaultQueue: 1}
	}
	setDefault(&c.Worker.ShutdownTimeout, DefaultShutdownTimeout, written, "worker", "shutdown_timeout")
	setDefault(&c.Worker.TaskCheckInterval, DefaultTaskCheckInterval, written, "worker", "task_check_interval")
	setDefault(&c.Worker.ParkedRetry, DefaultParkedRetry, written, "worker", "parked_retry")
	setDefault(&c.Worker.DelayedTaskCheckInterval, DefaultDelayedTaskCheckInterval, written, "worker", "delayed_task_check_interval")

	if c.Semaphore.Prefix == "" {
		c.Semaphore.Prefix = DefaultSemaphorePrefix
	}
	setDefault(&c.Semaphore.DefaultTTL, DefaultSemaphoreTTL, written, "semaphore", "default_ttl")

	if c.Monitoring.Addr == "" {
		c.Monitoring.Addr = DefaultMonitoringAddr
	}
	if c.Monitoring.AsynqmonReadOnly == nil {
		c.Monitoring.AsynqmonReadOnly = ptr(true)
	}

	if c.Tasks != nil {
		tasks := make(map[string]TaskConfig, len(c.Tasks))
		for typ, t := range c.Tasks {
			tasks[typ] = t.withDefaults(typ, c.Semaphore.DefaultTTL, written)
		}
		c.Tasks = tasks
	}
}

// setDefault sets the number *v, the field name of the section at path, to
// def when it is 0 and unset in written.
func setDefault[T int | time.Duration](v *T, def T, written fieldSet, path, name string) {
	if *v == 0 && written.unset(path, name) {
		*v = def
	}
}

// withDefaults returns t with its defaults applied; typ is the task type
// (the default key of its caps), written as for Config.withDefaults.
func (t TaskConfig) withDefaults(typ string, defaultTTL time.Duration, written fieldSet) TaskConfig {
	path := taskPath(typ)
	if t.Queue == "" {
		t.Queue = DefaultQueue
	}
	if t.MaxRetry == nil {
		t.MaxRetry = ptr(DefaultMaxRetry)
	}
	setDefault(&t.Timeout, DefaultTaskTimeout, written, path, "timeout")
	if t.Semaphore != nil {
		c := t.Semaphore.withDefaults(typ, defaultTTL, written, path+".semaphore")
		t.Semaphore = &c
	}
	if t.Semaphores != nil {
		caps := make([]CapConfig, len(t.Semaphores))
		for i, c := range t.Semaphores {
			caps[i] = c.withDefaults(typ, defaultTTL, written, indexPath(path+".semaphores", i))
		}
		t.Semaphores = caps
	}
	if t.RateLimits != nil {
		limits := make([]RateLimitConfig, len(t.RateLimits))
		for i, rl := range t.RateLimits {
			limits[i] = rl.withDefaults(typ, written, indexPath(path+".rate_limits", i))
		}
		t.RateLimits = limits
	}
	return t
}

// taskPath is the YAML path of the task type typ.
func taskPath(typ string) string {
	return keyPath("tasks", typ)
}

// withDefaults returns c, the cap at path, with its defaults applied
// (written as for Config.withDefaults). An empty typ or a zero defaultTTL
// leaves Key or TTL unset.
func (c CapConfig) withDefaults(typ string, defaultTTL time.Duration, written fieldSet, path string) CapConfig {
	if c.Key == "" {
		c.Key = typ
	}
	if c.Mode == "" {
		c.Mode = ModeRequeue
	}
	setDefault(&c.TTL, defaultTTL, written, path, "ttl")
	setDefault(&c.WaitTimeout, DefaultWaitTimeout, written, path, "wait_timeout")
	if c.AutoRenew == nil {
		c.AutoRenew = ptr(true)
	} else {
		c.AutoRenew = ptr(*c.AutoRenew)
	}
	if c.OnLeaseLost == "" {
		c.OnLeaseLost = LeaseLostCancel
	}
	if c.Standby != nil {
		c.Standby = ptr(*c.Standby)
	}
	c.CapacityOverrides = maps.Clone(c.CapacityOverrides)
	if c.CostFrom == "" {
		setDefault(&c.Cost, 1, written, path, "cost")
	}
	c.Weights = maps.Clone(c.Weights)
	return c
}

func ptr[T any](v T) *T { return &v }
