package worker

import (
	"maps"
	"time"
)

// withDefaults fills every unset field with its documented default. It is
// idempotent, and copies what it changes rather than writing through
// pointers the caller may share.
func (c *Config) withDefaults() {
	if c.Redis.EmbeddedAddr == "" {
		c.Redis.EmbeddedAddr = DefaultEmbeddedAddr
	}

	if c.Worker.Concurrency == 0 {
		c.Worker.Concurrency = DefaultConcurrency
	}
	if len(c.Worker.Queues) == 0 {
		c.Worker.Queues = map[string]int{DefaultQueue: 1}
	}
	if c.Worker.ShutdownTimeout == 0 {
		c.Worker.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Worker.TaskCheckInterval == 0 {
		c.Worker.TaskCheckInterval = DefaultTaskCheckInterval
	}
	if c.Worker.ParkedRetry == 0 {
		c.Worker.ParkedRetry = DefaultParkedRetry
	}
	if c.Worker.DelayedTaskCheckInterval == 0 {
		c.Worker.DelayedTaskCheckInterval = DefaultDelayedTaskCheckInterval
	}

	if c.Semaphore.Prefix == "" {
		c.Semaphore.Prefix = DefaultSemaphorePrefix
	}
	if c.Semaphore.DefaultTTL == 0 {
		c.Semaphore.DefaultTTL = DefaultSemaphoreTTL
	}

	if c.Monitoring.Addr == "" {
		c.Monitoring.Addr = DefaultMonitoringAddr
	}
	if c.Monitoring.AsynqmonReadOnly == nil {
		c.Monitoring.AsynqmonReadOnly = ptr(true)
	}

	if c.Tasks != nil {
		tasks := make(map[string]TaskConfig, len(c.Tasks))
		for typ, t := range c.Tasks {
			tasks[typ] = t.withDefaults(typ, c.Semaphore.DefaultTTL)
		}
		c.Tasks = tasks
	}
}

// withDefaults returns t with its defaults applied; typ is the task type
// (the default key of its caps).
func (t TaskConfig) withDefaults(typ string, defaultTTL time.Duration) TaskConfig {
	if t.Queue == "" {
		t.Queue = DefaultQueue
	}
	if t.MaxRetry == nil {
		t.MaxRetry = ptr(DefaultMaxRetry)
	}
	if t.Timeout == 0 {
		t.Timeout = DefaultTaskTimeout
	}
	if t.Semaphore != nil {
		c := t.Semaphore.withDefaults(typ, defaultTTL)
		t.Semaphore = &c
	}
	if t.Semaphores != nil {
		caps := make([]CapConfig, len(t.Semaphores))
		for i, c := range t.Semaphores {
			caps[i] = c.withDefaults(typ, defaultTTL)
		}
		t.Semaphores = caps
	}
	if t.RateLimits != nil {
		limits := make([]RateLimitConfig, len(t.RateLimits))
		for i, rl := range t.RateLimits {
			limits[i] = rl.withDefaults(typ)
		}
		t.RateLimits = limits
	}
	return t
}

// withDefaults returns c with its defaults applied. An empty typ or a zero
// defaultTTL leaves Key or TTL unset.
func (c CapConfig) withDefaults(typ string, defaultTTL time.Duration) CapConfig {
	if c.Key == "" {
		c.Key = typ
	}
	if c.Mode == "" {
		c.Mode = ModeRequeue
	}
	if c.TTL == 0 {
		c.TTL = defaultTTL
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
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
	return c
}

func ptr[T any](v T) *T { return &v }
