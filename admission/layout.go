package admission

import (
	"context"
	"log/slog"
	"maps"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/internal/layout"
)

// LayoutError is a refused start: the fleet's Redis holds another layout
// of fleetcap's keys than this build's (live processes of another build,
// or its data). Its message names both layouts and what to do.
type LayoutError = layout.Error

// ClaimLayout checks that rdb speaks this build's Redis layout and records
// this process (role "worker" or "producer") as live on it until the
// lease is closed (package internal/layout). A refusal is a *layout.Error
// that says what to do.
func ClaimLayout(ctx context.Context, rdb redis.UniversalClient, cfg *config.Config, table *Table, role string, log *slog.Logger) (*layout.Lease, error) {
	return layout.Claim(ctx, rdb, layout.Options{
		Role:            role,
		SemaphorePrefix: cfg.Semaphore.Prefix,
		CapKeys:         slices.Sorted(maps.Keys(table.Plain(KindCap))),
		Logger:          log,
	})
}
