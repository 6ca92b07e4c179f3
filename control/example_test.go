package control_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/ratelimit"
)

// An operator halves every tenant's cap and pauses one tenant; a worker's
// Reader answers from memory with what is in force.
func ExampleReader_CapacityFor() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	store, err := control.NewStore(rdb, control.Options{Prefix: "example:"})
	if err != nil {
		panic(err)
	}
	if err := store.SetCapacity(ctx, "tenant:{tenant_id}", 1); err != nil {
		panic(err)
	}
	if err := store.SetCapacity(ctx, "tenant:evil", 0); err != nil {
		panic(err)
	}

	overrides, err := control.NewReader(ctx, store, control.ReaderOptions{})
	if err != nil {
		panic(err)
	}
	defer overrides.Close()
	for _, key := range []string{"tenant:acme", "tenant:evil", "legacy-api"} {
		template := "tenant:{tenant_id}"
		if key == "legacy-api" {
			template = "" // a plain key
		}
		capacity, overridden := overrides.CapacityFor(key, template, 2)
		fmt.Printf("%s: %d (override: %v)\n", key, capacity, overridden)
	}

	// Back to the config.
	if _, err := store.ClearCapacity(ctx, "tenant:{tenant_id}"); err != nil {
		panic(err)
	}
	if err := overrides.Refresh(ctx); err != nil {
		panic(err)
	}
	capacity, _ := overrides.CapacityFor("tenant:acme", "tenant:{tenant_id}", 2)
	fmt.Println("tenant:acme after the clear:", capacity)
	// Output:
	// tenant:acme: 1 (override: true)
	// tenant:evil: 0 (override: true)
	// legacy-api: 2 (override: false)
	// tenant:acme after the clear: 2
}

// A rate override replaces rate, per and burst together.
func ExampleStore_SetRate() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	store, err := control.NewStore(rdb, control.Options{Prefix: "example:rates:"})
	if err != nil {
		panic(err)
	}
	if err := store.SetRate(ctx, "stripe:{account_id}", ratelimit.Limit{Rate: 25, Per: time.Second, Burst: 5}); err != nil {
		panic(err)
	}
	o, err := store.Load(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(o.Rates["stripe:{account_id}"])
	fmt.Println(rdb.HGet(ctx, store.Key(), "rate:stripe:{account_id}").Val())
	// Output:
	// 25 per 1s (burst 5)
	// {"rate":25,"per":"1s","burst":5}
}
