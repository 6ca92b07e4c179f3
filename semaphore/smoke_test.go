package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/redistest"
	"github.com/fleetcap/fleetcap/semaphore"
)

func TestSmoke(t *testing.T) {
	srv := redistest.Start(t)
	s, err := semaphore.New(srv.Client(), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var ps []*semaphore.Permit
	for i := 0; i < 3; i++ {
		p, err := s.TryAcquire(ctx, "k", 3, semaphore.WithHolder("h"))
		if err != nil || p == nil {
			t.Fatalf("try %d: %v %v", i, p, err)
		}
		ps = append(ps, p)
	}
	p, err := s.TryAcquire(ctx, "k", 3)
	if p != nil || err != nil {
		t.Fatalf("full: %v %v", p, err)
	}
	hs, err := s.Holders(ctx, "k")
	t.Log(hs, err)
	go func() { time.Sleep(50 * time.Millisecond); t.Log("release", ps[0].Release(ctx)) }()
	start := time.Now()
	p, err = s.Acquire(ctx, "k", 3)
	t.Log("acquired after", time.Since(start), p, err)
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.UsedPermits(ctx, "k")
	t.Log("used", n, err)
	t.Log(srv.Client().Keys(ctx, "*").Val())
}
