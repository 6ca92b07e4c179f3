package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/semaphore"
)

// At most 5 calls to the legacy API run at once across every process that
// shares the Redis.
func ExampleService_WithPermit() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	sem, err := semaphore.New(rdb, semaphore.Options{})
	if err != nil {
		panic(err)
	}
	defer sem.Close()

	err = sem.WithPermit(context.Background(), "legacy-api", 5, func(ctx context.Context) error {
		fmt.Println("calling the legacy API")
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// calling the legacy API
	// err: <nil>
}

// A long multi-step job holds its seat with a lease it renews, and gives up
// when no seat frees within 10 seconds.
func ExampleService_Acquire() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	sem, err := semaphore.New(rdb, semaphore.Options{})
	if err != nil {
		panic(err)
	}
	defer sem.Close()
	ctx := context.Background()

	permit, err := sem.Acquire(ctx, "report-export", 5,
		semaphore.WithTTL(60*time.Second),
		semaphore.WithWaitTimeout(10*time.Second),
		semaphore.WithAutoRenew(),
		semaphore.WithHolder("job-42"),
	)
	var aerr *semaphore.AcquisitionError
	if errors.As(err, &aerr) {
		fmt.Println("no seat:", aerr.Reason)
		return
	}
	defer permit.Release(ctx)

	holders, _ := sem.Holders(ctx, "report-export")
	fmt.Println("held by:", holders[0].Label, "renewing:", permit.IsAutoRenewing())
	// Output:
	// held by: job-42 renewing: true
}

// TryAcquire skips this round instead of waiting when every seat is taken.
func ExampleService_TryAcquire() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	sem, err := semaphore.New(rdb, semaphore.Options{})
	if err != nil {
		panic(err)
	}
	defer sem.Close()
	ctx := context.Background()

	first, _ := sem.TryAcquire(ctx, "licence-seat", 1)
	second, err := sem.TryAcquire(ctx, "licence-seat", 1)
	fmt.Println("first:", first != nil, "second:", second != nil, "err:", err)
	_ = first.Release(ctx)
	// Output:
	// first: true second: false err: <nil>
}

// fencedStore is a resource that checks fences: it refuses a write whose
// fence is below the highest it has seen.
type fencedStore struct {
	highest uint64
	value   string
}

func (s *fencedStore) Write(fence uint64, value string) error {
	if fence < s.highest {
		return fmt.Errorf("refused: fence %d is below %d", fence, s.highest)
	}
	s.highest, s.value = fence, value
	return nil
}

// A holder paused past its lease (a long GC pause, a stopped VM) still
// holds its Permit when it wakes, but its seat went to someone else. The
// store refuses its late write, because the new holder's fence is greater.
func ExamplePermit_Fence() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	sem, err := semaphore.New(rdb, semaphore.Options{})
	if err != nil {
		panic(err)
	}
	defer sem.Close()
	ctx := context.Background()
	store := &fencedStore{}

	paused, err := sem.Acquire(ctx, "ledger", 1, semaphore.WithTTL(100*time.Millisecond))
	if err != nil {
		panic(err)
	}
	fmt.Println("first holder writes:", store.Write(paused.Fence(), "a"))

	// The first holder pauses; its lease lapses and the seat goes on.
	next, err := sem.Acquire(ctx, "ledger", 1, semaphore.WithWaitTimeout(5*time.Second))
	if err != nil {
		panic(err)
	}
	defer next.Release(ctx)
	fmt.Println("next holder writes:", store.Write(next.Fence(), "b"))

	// The first holder wakes and writes what it had computed.
	err = store.Write(paused.Fence(), "stale")
	fmt.Println("late write refused:", err != nil, "value:", store.value)
	// Output:
	// first holder writes: <nil>
	// next holder writes: <nil>
	// late write refused: true value: b
}

// A print job takes one seat of the printer pool per 10 pages: a heavy job
// takes several, and UsedPermits counts seats.
func ExampleWithWeight() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	sem, err := semaphore.New(rdb, semaphore.Options{})
	if err != nil {
		panic(err)
	}
	defer sem.Close()
	ctx := context.Background()

	big, err := sem.Acquire(ctx, "printers", 4, semaphore.WithWeight(3))
	if err != nil {
		panic(err)
	}
	seats, _ := sem.UsedPermits(ctx, "printers")
	another, _ := sem.TryAcquire(ctx, "printers", 4, semaphore.WithWeight(2))
	fmt.Println("seats used:", seats, "a second heavy job gets one:", another != nil)
	_ = big.Release(ctx)
	// Output:
	// seats used: 3 a second heavy job gets one: false
}

// Tenant acme's backlog does not hold up globex: when the key is full,
// the tenants that wait take turns at the seats that free (globex, of
// weight 2, twice as often as acme), first come first served within a
// tenant.
func ExampleWithShare() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	sem, err := semaphore.New(rdb, semaphore.Options{})
	if err != nil {
		panic(err)
	}
	defer sem.Close()
	ctx := context.Background()

	held, err := sem.Acquire(ctx, "exports", 1)
	if err != nil {
		panic(err)
	}
	served := make(chan string, 4)
	for i, w := range []struct {
		tenant string
		weight int
	}{{"acme", 1}, {"acme", 1}, {"acme", 1}, {"globex", 2}} {
		go func() {
			p, err := sem.Acquire(ctx, "exports", 1, semaphore.WithShare(w.tenant, w.weight))
			if err != nil {
				served <- err.Error()
				return
			}
			served <- w.tenant
			_ = p.Release(ctx)
		}()
		// Each joins the line after the one before it.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			if st, _ := sem.RoomStats(ctx, "exports"); st.Waiting == i+1 || time.Now().After(deadline) {
				break
			}
		}
	}
	_ = held.Release(ctx)
	for range 4 {
		fmt.Print(<-served, " ")
	}
	fmt.Println()
	// Output:
	// acme globex acme acme
}
