// Package testutil holds, in its subdirectories, what only fleetcap's
// tests and benchmarks use: private redis-servers (redistest), fleets of
// probe worker processes (fleettest, probeworker), a TCP proxy for
// partitions (tcpproxy), waiting on a condition with a deadline (waitfor),
// a goroutine-safe log buffer (syncbuf) and readers of parsed metrics
// (metricstest).
//
// No production package imports any of them (bench, the benchmarks, may):
// TestNoProductionPackageImportsTestutil checks it. The packages beside
// this directory (internal/asynqx, internal/layout, internal/snapshot,
// internal/taskspan) are the other kind: production code.
package testutil
