package worker

import (
	"context"
	"log/slog"
	"maps"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/layout"
)

// LayoutError is a refused start: the fleet's Redis holds another layout
// of fleetcap's keys than this build's (live processes of another build,
// or its data). Its message names both layouts and what to do. New returns
// it, and so does a producer's first capped enqueue (see Gate).
type LayoutError = layout.Error

// claimLayout checks that rdb speaks this build's Redis layout and records
// this process (role "worker" or "producer") as live on it until the
// lease is closed (package internal/layout).
func claimLayout(ctx context.Context, rdb redis.UniversalClient, cfg *Config, caps *capTable, role string, log *slog.Logger) (*layout.Lease, error) {
	return layout.Claim(ctx, rdb, layout.Options{
		Role:            role,
		SemaphorePrefix: cfg.Semaphore.Prefix,
		CapKeys:         slices.Sorted(maps.Keys(caps.plainKeys())),
		Logger:          log,
	})
}
