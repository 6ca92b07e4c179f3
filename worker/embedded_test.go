package worker

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
)

func TestStartEmbedded(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(redistest.FreePort(t)))
	m, err := StartEmbedded(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Addr() != addr {
		t.Errorf("Addr() = %q, want %q", m.Addr(), addr)
	}

	cfg := config.RedisConfig{EmbeddedAddr: addr}
	rdb, err := cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping the embedded redis: %v", err)
	}

	opt, err := cfg.AsynqConnOpt()
	if err != nil {
		t.Fatal(err)
	}
	client := asynq.NewClient(opt)
	defer client.Close()
	if _, err := client.EnqueueContext(ctx, asynq.NewTask("test:embedded", []byte(`{}`))); err != nil {
		t.Fatalf("asynq enqueue on the embedded redis: %v", err)
	}

	if _, err := StartEmbedded(addr); err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("second StartEmbedded on %s: err = %v, want address in use", addr, err)
	}
}
