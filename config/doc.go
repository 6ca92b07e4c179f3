// Package config is fleetcap's config.yaml: one documented struct per
// section (Config, RedisConfig, WorkerConfig, SemaphoreConfig,
// MonitoringConfig, TaskConfig with its caps and rate limits), LoadConfig and
// ParseConfig that decode a file strictly, apply the defaults and the
// environment overrides and validate it with messages that name each bad
// field by YAML path, the semaphore key templates over a task's payload
// (KeyTemplate), and the connections to the configured Redis (server, TLS,
// Sentinel or Cluster) for go-redis and asynq.
//
// It is the part of fleetcap that a service that only enqueues needs
// (package producer): it links asynq, go-redis, the YAML parser and package
// ratelimit (for a limit's type), and nothing of the worker's world (no
// semaphore, metrics, asynqmon or embedded Redis). Package worker runs what
// it describes; worker.Config, worker.LoadConfig and worker.ParseConfig are
// the same names there.
package config
