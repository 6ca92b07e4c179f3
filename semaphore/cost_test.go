package semaphore_test

import (
	"context"
	"testing"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/semaphore"
)

// BenchmarkQuickCycle is the Go cost of S3's uncontended cycle, one caller
// at a time: Acquire on a key far from full (quick.lua) and Release (the
// plain give), against a real Redis.
func BenchmarkQuickCycle(b *testing.B) {
	svc, err := semaphore.New(redistest.Start(b).Client(), semaphore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := svc.Acquire(ctx, "cycle", 1000)
		if err != nil {
			b.Fatalf("Acquire: %v", err)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatalf("Release: %v", err)
		}
	}
}
