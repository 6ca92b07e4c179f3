package worker

import (
	"github.com/fleetcap/fleetcap/admission"
	"github.com/fleetcap/fleetcap/config"
)

// The worker's config is package config's; these names stay here for code
// written against package worker (SPEC §2.1).

// Config is config.Config: the whole of config.yaml.
type Config = config.Config

// TaskConfig is config.TaskConfig: the declaration of one task type.
type TaskConfig = config.TaskConfig

// CapConfig is config.CapConfig: one fleet-wide concurrency cap (see
// Worker.SetCaps).
type CapConfig = config.CapConfig

// RateLimitConfig is config.RateLimitConfig: one fleet-wide rate limit of a
// task type.
type RateLimitConfig = config.RateLimitConfig

const (
	// EnvRedisURL is config.EnvRedisURL: the environment variable that
	// overrides redis.url in LoadConfig.
	EnvRedisURL = config.EnvRedisURL
	// DefaultMaxRetry is config.DefaultMaxRetry: a task type's max_retry
	// when the config sets none.
	DefaultMaxRetry = config.DefaultMaxRetry
	// DefaultTaskTimeout is config.DefaultTaskTimeout: a task type's timeout
	// when the config sets none.
	DefaultTaskTimeout = config.DefaultTaskTimeout
)

// LoadConfig is config.LoadConfig: it reads the config file at path,
// applies the defaults and the environment overrides and validates it.
func LoadConfig(path string) (*Config, error) { return config.LoadConfig(path) }

// ParseConfig is config.ParseConfig: it parses a config file's contents,
// applies the defaults and validates it, without environment overrides.
func ParseConfig(data []byte) (*Config, error) { return config.ParseConfig(data) }

// LayoutError is a refused start (admission.LayoutError): the fleet's
// Redis holds another layout of fleetcap's keys than this build's. New
// returns it, and so does a producer's first capped enqueue.
type LayoutError = admission.LayoutError
