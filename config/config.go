package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/fleetcap/fleetcap/internal/rediskey"
)

// Config is the whole of config.yaml. Each section maps 1:1 to a struct below;
// every field documents its default. Build one with LoadConfig or
// ParseConfig, which apply the defaults and validate.
//
// In a file, a field takes its default only when it is left out (or null):
// a value written out of the field's range is an error naming the field,
// 0 included (a written "concurrency: 0" is not the default). A Config
// built in code cannot tell a field left out from 0, so there a numeric
// field that is 0 takes its default, as its doc says; the fields where 0
// means something (max_retry, standby) are pointers, nil for the default.
type Config struct {
	Redis      RedisConfig           `yaml:"redis"`
	Worker     WorkerConfig          `yaml:"worker"`
	Semaphore  SemaphoreConfig       `yaml:"semaphore"`
	Monitoring MonitoringConfig      `yaml:"monitoring"`
	Tasks      map[string]TaskConfig `yaml:"tasks"` // task type -> its settings
}

// RedisConfig says where the fleet's Redis is. Set at most one of URL and
// ClusterAddrs; with neither, the worker runs an embedded Redis (miniredis).
type RedisConfig struct {
	// URL is a redis://, rediss:// (TLS) or redis-sentinel:// URL; default ""
	// (embedded). FLEETCAP_REDIS_URL overrides it.
	URL string `yaml:"url"`
	// ClusterAddrs are Redis Cluster seed nodes: host:port, or redis:// or
	// rediss:// URLs when the cluster needs a login or TLS (every seed with
	// the same scheme, user and password); default none.
	ClusterAddrs []string `yaml:"cluster_addrs"`
	// EmbeddedAddr is where the embedded Redis listens; default 127.0.0.1:6380.
	EmbeddedAddr string `yaml:"embedded_addr"`
	// EmbeddedFile is where the embedded Redis keeps its data between runs:
	// saved when the worker stops, loaded when it starts. LoadConfig makes a
	// relative path relative to the config file's directory and defaults it
	// to .fleetcap/embedded.json there; with ParseConfig (no file) the
	// default is "": nothing is kept.
	EmbeddedFile string `yaml:"embedded_file"`
	// TLS completes rediss:// connections (url or cluster_addrs) with a CA
	// to trust and a client certificate; default none.
	TLS RedisTLSConfig `yaml:"tls"`
}

// RedisTLSConfig names PEM files for TLS connections to Redis.
type RedisTLSConfig struct {
	// CAFile holds the CA certificates to trust instead of the system's;
	// default "" (the system's).
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the client certificate and its key, for a
	// server that asks for one (tls-auth-clients); set both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// WorkerConfig tunes one worker process.
type WorkerConfig struct {
	// Concurrency is how many tasks one process runs at once (>= 1);
	// default 10, also when 0 in code.
	Concurrency int `yaml:"concurrency"`
	// Queues maps queue name to priority (>= 1); default {default: 1}.
	Queues map[string]int `yaml:"queues"`
	// ShutdownTimeout bounds how long in-flight tasks may run after a
	// shutdown signal (> 0: asynq takes 0 for its own default, so there is
	// no "no limit"); default 8s, also when 0 in code.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// TaskCheckInterval is the longest an idle process waits before it
	// looks for tasks again; a task pushed onto one of its queues (new,
	// retried, or woken) wakes it at once (at least 1ms); default 2s, also
	// when 0 in code.
	TaskCheckInterval time.Duration `yaml:"task_check_interval"`
	// DelayedTaskCheckInterval is how often scheduled and retried tasks are
	// moved to their queue (asynq's forwarder; at least 100ms); default 5s,
	// as asynq's, also when 0 in code. Tasks woken from a waiting room do
	// not wait for it.
	DelayedTaskCheckInterval time.Duration `yaml:"delayed_task_check_interval"`
	// ParkedRetry is how long a task parked in a cap's waiting room stays
	// away before asynq brings it back by itself, when no wake-up brought it
	// sooner: only a safety net (at least 1s); default 1m, also when 0 in
	// code.
	ParkedRetry time.Duration `yaml:"parked_retry"`
}

// SemaphoreConfig configures the fleet-wide semaphore service.
type SemaphoreConfig struct {
	// Prefix starts every Redis key the fleet owns: its semaphores, its
	// runtime overrides, its rate limits and the watches of its idle
	// queues (internal/rediskey lists them); default "fleetcap:sem:".
	// Fleets with different prefixes share a Redis without seeing each
	// other's keys (asynq's own keys they keep apart by their queues).
	Prefix string `yaml:"prefix"`
	// DefaultTTL is the lease of a cap that sets no ttl (at least 1ms);
	// default 30s, also when 0 in code.
	DefaultTTL time.Duration `yaml:"default_ttl"`
}

// MonitoringConfig configures the monitoring HTTP server.
type MonitoringConfig struct {
	// Addr is the listen address; default 127.0.0.1:8080.
	Addr string `yaml:"addr"`
	// AdminToken guards the admin endpoints; default "" (admin endpoints
	// off). FLEETCAP_ADMIN_TOKEN overrides it.
	AdminToken string `yaml:"admin_token"`
	// AsynqmonReadOnly serves asynqmon without its mutating actions; default
	// true.
	AsynqmonReadOnly *bool `yaml:"asynqmon_read_only"`
}

// TaskConfig is the declaration of one task type.
type TaskConfig struct {
	// Queue is the asynq queue the task goes to; default "default". It must
	// be one of worker.queues.
	Queue string `yaml:"queue"`
	// MaxRetry is asynq's retry budget (>= 0); default 25 (asynq's
	// default) when nil. 0 means no retry: a task whose handler fails is
	// archived at once. Tasks requeued for a full semaphore or a rate
	// limit do not spend it, and are never archived for it.
	MaxRetry *int `yaml:"max_retry"`
	// Timeout bounds one run of the handler (> 0: asynq takes 0 for its
	// own default, so there is no "no limit"); default 30m (asynq's
	// default), also when 0 in code.
	Timeout time.Duration `yaml:"timeout"`
	// Semaphore is the task's fleet-wide cap; default none.
	Semaphore *CapConfig `yaml:"semaphore"`
	// Semaphores are several caps that must all be held (instead of
	// Semaphore); default none.
	Semaphores []CapConfig `yaml:"semaphores"`
	// RateLimits are fleet-wide rate limits whose tokens the task must all
	// take before it runs, beside its caps; default none.
	RateLimits []RateLimitConfig `yaml:"rate_limits"`
}

// Mode says what a worker does when a task's semaphore is full.
type Mode string

// The modes. For a cap they behave alike: a task that finds no seat waits
// in its slot (up to wait_timeout) only with one of the cap's standby
// places, fleet-wide, and otherwise goes back to its queue without a
// failure, to wait in the cap's waiting room in Redis. For a rate limit,
// ModeWait sleeps in the slot until the tokens are due (up to
// wait_timeout), ModeRequeue goes back at once.
const (
	// ModeRequeue puts a task that cannot run yet back in its queue without
	// counting a failure.
	ModeRequeue Mode = "requeue"
	// ModeWait waits up to wait_timeout in the slot first.
	ModeWait Mode = "wait"
)

// LeaseLostPolicy says what happens to a running task whose lease is lost.
type LeaseLostPolicy string

// The lease-lost policies.
const (
	// LeaseLostCancel cancels the handler's context.
	LeaseLostCancel LeaseLostPolicy = "cancel"
	// LeaseLostContinue lets the handler finish; the loss is logged and
	// counted.
	LeaseLostContinue LeaseLostPolicy = "continue"
)

// CapConfig is one fleet-wide concurrency cap: a semaphore key and its
// capacity, and how a task takes a seat.
type CapConfig struct {
	// Key names the semaphore; default the task type. It may be a template
	// over the task's JSON payload such as "tenant:{tenant_id}" (see
	// ParseKeyTemplate).
	Key string `yaml:"key"`
	// Capacity is the number of seats across the fleet (>= 1); required.
	// (Only a runtime override can pause a key with 0, never the config.)
	Capacity int `yaml:"capacity"`
	// Mode is requeue or wait; default requeue. For caps both behave alike
	// (the field stays for configs that set it): a task without a seat
	// stands by within Standby, up to WaitTimeout, and waits in Redis
	// beyond it.
	Mode Mode `yaml:"mode"`
	// TTL is the lease of a seat (at least 1ms); default
	// semaphore.default_ttl, also when 0 in code.
	TTL time.Duration `yaml:"ttl"`
	// WaitTimeout is how long a task that stands by waits in its slot for a
	// seat (> 0; Standby 0 is the way to have none stand by); default 10s,
	// also when 0 in code.
	WaitTimeout time.Duration `yaml:"wait_timeout"`
	// AutoRenew renews the lease while the task runs; default true.
	AutoRenew *bool `yaml:"auto_renew"`
	// OnLeaseLost is cancel or continue; default cancel.
	OnLeaseLost LeaseLostPolicy `yaml:"on_lease_lost"`
	// Standby is how many tasks of this cap may wait in a worker slot for
	// the next seat at once, across the whole fleet (the others wait in
	// Redis), so that a freed seat is taken at once (>= 0); default the
	// capacity (in force) when nil. 0 turns it off: every task without a
	// seat waits in Redis.
	Standby *int `yaml:"standby"`
	// CapacityOverrides sets the capacity of single rendered keys of a
	// templated Key, such as {"tenant:acme": 20}, each >= 1; default none.
	CapacityOverrides map[string]int `yaml:"capacity_overrides"`
	// FairBy is a template over the task's JSON payload, in the syntax of
	// Key, such as "{tenant_id}": when the key is full, its freed seats go
	// round the rendered values that have tasks waiting (weighted round
	// robin, see Weights), first come first served within a value. It must
	// name a payload field; default "" (one line, first come first
	// served). See FairValue.
	FairBy string `yaml:"fair_by"`
	// Weights maps a rendered FairBy value to its weight (>= 1): a value
	// of weight 3 gets three turns for one of a value of weight 1. Only
	// with FairBy; default none (every value weighs 1). See WeightOf.
	Weights map[string]int `yaml:"weights"`
	// Cost is the seats one task takes (1..capacity, and at most every
	// value of CapacityOverrides); default 1 when CostFrom is unset, also
	// when 0 in code. Set either Cost or CostFrom.
	Cost int `yaml:"cost"`
	// CostFrom is a dotted path of an integer field of the task's JSON
	// payload, such as "pages" or "job.pages" (no braces), that gives the
	// seats one task takes instead of Cost: a payload without it, or with
	// a value that is not an integer in 1..capacity, is bad input. Default
	// "" (Cost). See CostOf.
	CostFrom string `yaml:"cost_from"`
	// MaxWaiting bounds the tasks that may wait for the key, fleet-wide
	// (parked in Redis or standing by, >= 1): a producer refuses a task
	// whose key already has that many waiting (producer.ErrFull).
	// Default 0: no bound. The bound is checked, not reserved: producers
	// enqueueing at the same moment may overshoot it by their number.
	MaxWaiting int `yaml:"max_waiting"`
}

// Defaults of the config, as documented on the fields.
const (
	DefaultEmbeddedAddr    = "127.0.0.1:6380"
	DefaultConcurrency     = 10
	DefaultQueue           = "default"
	DefaultShutdownTimeout = 8 * time.Second
	DefaultSemaphorePrefix = rediskey.DefaultPrefix // "fleetcap:sem:"
	DefaultSemaphoreTTL    = 30 * time.Second
	DefaultMonitoringAddr  = "127.0.0.1:8080"
	DefaultMaxRetry        = 25
	DefaultTaskTimeout     = 30 * time.Minute
	DefaultWaitTimeout     = 10 * time.Second

	DefaultTaskCheckInterval        = 2 * time.Second
	DefaultDelayedTaskCheckInterval = 5 * time.Second
	DefaultParkedRetry              = time.Minute
)

// Environment variables that override the config file in LoadConfig. An
// empty value leaves the file's value in place.
const (
	EnvRedisURL   = "FLEETCAP_REDIS_URL"
	EnvAdminToken = "FLEETCAP_ADMIN_TOKEN"
)

// LoadConfig reads the config file at path, applies the defaults and the
// environment overrides (FLEETCAP_REDIS_URL, FLEETCAP_ADMIN_TOKEN) and
// validates the result. A validation error names every bad field by its YAML
// path, one per line.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg, err := parseConfig(data, os.Getenv)
	if err != nil {
		if joined, ok := err.(interface{ Unwrap() []error }); ok && len(joined.Unwrap()) > 1 {
			return nil, fmt.Errorf("config %s: %d problems:\n%w", path, len(joined.Unwrap()), err)
		}
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	cfg.Redis.resolveEmbeddedFile(filepath.Dir(path))
	return cfg, nil
}

// ParseConfig parses a config file's contents, applies the defaults and
// validates the result, like LoadConfig but without environment overrides.
func ParseConfig(data []byte) (*Config, error) {
	return parseConfig(data, nil)
}

// parseConfig decodes, applies defaults to the fields the file left out,
// then the environment (when getenv is not nil), then validates. Decoding
// errors and validation errors are reported together, except validation
// errors about a field that did not decode.
func parseConfig(data []byte, getenv func(string) string) (*Config, error) {
	cfg, written, bad, err := decodeConfig(data)
	if err != nil {
		return nil, err
	}
	cfg.withDefaults(written)
	if getenv != nil {
		cfg.applyEnv(getenv)
	}
	errs := make([]error, 0, len(bad))
	for _, e := range bad {
		errs = append(errs, e)
	}
	for _, e := range cfg.fieldErrors(written) {
		if !slices.ContainsFunc(bad, func(b fieldError) bool { return b.covers(e.path) }) {
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return cfg, nil
}

// applyEnv lets non-empty environment variables override secrets and
// addresses.
func (c *Config) applyEnv(getenv func(string) string) {
	if v := getenv(EnvRedisURL); v != "" {
		c.Redis.URL = v
	}
	if v := getenv(EnvAdminToken); v != "" {
		c.Monitoring.AdminToken = v
	}
}

// TaskTypes returns the declared task types, sorted.
func (c *Config) TaskTypes() []string {
	return slices.Sorted(maps.Keys(c.Tasks))
}

// Caps returns the task's caps in declaration order: its one semaphore, or
// its semaphores list, or none. Mode, wait_timeout, auto_renew and
// on_lease_lost defaults are applied here; key and ttl defaults depend on the
// task type and the semaphore section and are filled in by LoadConfig and
// ParseConfig. The result is a copy.
func (t TaskConfig) Caps() []CapConfig {
	caps := t.declaredCaps()
	for i := range caps {
		caps[i] = caps[i].withDefaults("", 0, nil, "")
	}
	return caps
}

// declaredCaps returns the task's caps in declaration order, as they are:
// a copy, without defaults.
func (t TaskConfig) declaredCaps() []CapConfig {
	var caps []CapConfig
	if t.Semaphore != nil {
		caps = append(caps, *t.Semaphore)
	}
	return append(caps, t.Semaphores...)
}

// CapacityFor returns the capacity of the semaphore with the rendered key:
// its capacity_overrides entry if there is one, else Capacity.
func (c CapConfig) CapacityFor(renderedKey string) int {
	if n, ok := c.CapacityOverrides[renderedKey]; ok {
		return n
	}
	return c.Capacity
}

// KeyTemplate parses the cap's key (see ParseKeyTemplate).
func (c CapConfig) KeyTemplate() (*KeyTemplate, error) {
	return ParseKeyTemplate(c.Key)
}

// RenderKey returns the semaphore key for a task with this payload: the key
// itself, or the key template rendered from the payload. An error means the
// payload cannot be capped and the task must not run.
func (c CapConfig) RenderKey(payload []byte) (string, error) {
	kt, err := ParseKeyTemplate(c.Key)
	if err != nil {
		return "", err
	}
	return kt.Render(payload)
}

// FairValue returns the cap's FairBy template rendered from payload: the
// value whose turn a task of this payload waits for; "" when the cap has no
// FairBy. An error names the template and the field: the task cannot be
// capped and must not run.
func (c CapConfig) FairValue(payload []byte) (string, error) {
	if c.FairBy == "" {
		return "", nil
	}
	kt, err := ParseKeyTemplate(c.FairBy)
	if err != nil {
		return "", fmt.Errorf("fair_by: %w", err)
	}
	return kt.render("fair_by template", payload)
}

// WeightOf returns the weight of a rendered FairBy value: its Weights
// entry, else 1.
func (c CapConfig) WeightOf(value string) int {
	if n, ok := c.Weights[value]; ok && n >= 1 {
		return n
	}
	return 1
}

// CostOf returns the seats a task of this payload takes of a key of
// capacity seats (give the configured capacity, CapacityFor): Cost (1 when
// 0), or the integer at CostFrom in payload. A field that is missing, not
// an integer, or outside 1..capacity is an error naming the field and its
// value: the task cannot be capped and must not run.
func (c CapConfig) CostOf(payload []byte, capacity int) (int, error) {
	if c.CostFrom == "" {
		cost := max(c.Cost, 1)
		if cost > capacity {
			return 0, fmt.Errorf("cost %d is outside 1..%d (the capacity)", cost, capacity)
		}
		return cost, nil
	}
	path, err := parseFieldPath(c.CostFrom)
	if err != nil {
		return 0, fmt.Errorf("cost_from %q: %w", c.CostFrom, err)
	}
	obj, err := decodeObject(payload)
	if err != nil {
		return 0, fmt.Errorf("cost_from %q: %w", c.CostFrom, err)
	}
	v, err := lookupValue(obj, path)
	if err != nil {
		return 0, fmt.Errorf("cost_from: %w", err)
	}
	if n, ok := v.(json.Number); ok {
		if cost, err := strconv.Atoi(n.String()); err == nil && cost >= 1 && cost <= capacity {
			return cost, nil
		}
	}
	return 0, fmt.Errorf("cost_from: payload field %q is %s, want an integer in 1..%d (the capacity)", c.CostFrom, describeJSON(v), capacity)
}

// AutoRenewEnabled reports whether the lease is renewed while the task runs
// (auto_renew, default true).
func (c CapConfig) AutoRenewEnabled() bool {
	return c.AutoRenew == nil || *c.AutoRenew
}

// ReadOnly reports whether asynqmon is served read-only (default true).
func (m MonitoringConfig) ReadOnly() bool {
	return m.AsynqmonReadOnly == nil || *m.AsynqmonReadOnly
}
