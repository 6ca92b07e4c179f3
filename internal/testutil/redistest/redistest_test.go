package redistest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStartTLS(t *testing.T) {
	s := StartTLS(t, "fleet", "pw-tls-test", true)
	ctx := context.Background()
	if err := s.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("TLS with the ACL user: %v", err)
	}
	plain := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("a plain-text client was answered")
	}
	noUser := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: s.TLSConfig(), MaxRetries: -1})
	defer noUser.Close()
	if err := noUser.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("the default user: want NOAUTH, got %v", err)
	}
	noCert := s.TLSConfig()
	noCert.Certificates = nil
	anon := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: noCert, Username: s.Username, Password: s.Password, MaxRetries: -1})
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil {
		t.Fatal("a client without a certificate was answered")
	}
}

func TestStartSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a sentinel failover")
	}
	s := StartSentinel(t, 1, 3)
	ctx := context.Background()
	old, err := s.MasterAddr(ctx)
	if err != nil || old != s.Master.Addr() {
		t.Fatalf("master %q, %v; want %s", old, err, s.Master.Addr())
	}
	if err := s.Master.Client().Set(ctx, "before-failover", "kept", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Master.Client().Do(ctx, "WAIT", 1, 5000).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.Master.Kill()
	now, err := s.WaitFailover(old, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if now != s.Replicas[0].Addr() {
		t.Fatalf("new master %s, want the replica %s", now, s.Replicas[0].Addr())
	}
	t.Logf("failover to %s in %s", now, time.Since(start).Round(time.Millisecond))
	if v, err := s.Replicas[0].Client().Get(ctx, "before-failover").Result(); err != nil || v != "kept" {
		t.Fatalf("the new master lost a replicated key: %q, %v", v, err)
	}
}
