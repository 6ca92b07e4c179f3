package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel is a master, its replicas and the sentinels that watch them,
// owned by a test.
type Sentinel struct {
	MasterName string
	Master     *Server
	Replicas   []*Server
	Sentinels  []*Server
	tb         testing.TB
}

// StartSentinel starts a master with replicas, and sentinels (quorum
// sentinels/2+1) that declare the master down after 1 s and fail over
// within 3 s. It returns when every sentinel sees the replicas and the
// other sentinels, so a failover can start at once.
func StartSentinel(tb testing.TB, replicas, sentinels int) *Sentinel {
	tb.Helper()
	s := &Sentinel{MasterName: "mymaster", tb: tb}
	s.Master = Start(tb, Option{"--repl-diskless-sync-delay", "0"})
	for range replicas {
		r := Start(tb, Option{"--replicaof", "127.0.0.1", strconv.Itoa(s.Master.Port()), "--repl-diskless-sync-delay", "0"})
		s.Replicas = append(s.Replicas, r)
		if err := waitLinkUp(r, 30*time.Second); err != nil {
			tb.Fatalf("redistest: replica %s: %v\n%s", r.Addr(), err, r.Log())
		}
	}
	for range sentinels {
		sv := &Server{tb: tb, dir: tb.TempDir(), port: FreePort(tb)}
		sv.conf = filepath.Join(sv.dir, "sentinel.conf")
		conf := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d %d
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 3000
sentinel parallel-syncs %s 1
`, sv.port, sv.dir, filepath.Join(sv.dir, "redis.log"), s.MasterName, s.Master.Port(), sentinels/2+1,
			s.MasterName, s.MasterName, s.MasterName)
		if err := os.WriteFile(sv.conf, []byte(conf), 0o600); err != nil {
			tb.Fatal(err)
		}
		sv.start()
		tb.Cleanup(sv.Stop)
		s.Sentinels = append(s.Sentinels, sv)
	}
	if err := s.waitSettled(replicas, sentinels-1, 30*time.Second); err != nil {
		tb.Fatalf("redistest: sentinel: %v", err)
	}
	return s
}

// Addrs lists the sentinels' host:port.
func (s *Sentinel) Addrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, sv := range s.Sentinels {
		out[i] = sv.Addr()
	}
	return out
}

// URL is the redis-sentinel:// URL that fleetcap's config reads.
func (s *Sentinel) URL() string {
	return "redis-sentinel://" + strings.Join(s.Addrs(), ",") + "/" + s.MasterName
}

// MasterAddr asks the first sentinel that answers where the master is.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var err error
	for _, sv := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sv.Addr()})
		var addr []string
		addr, err = c.GetMasterAddrByName(ctx, s.MasterName).Result()
		_ = c.Close()
		if err == nil && len(addr) == 2 {
			return net.JoinHostPort(addr[0], addr[1]), nil
		}
	}
	return "", fmt.Errorf("no sentinel names the master: %v", err)
}

// WaitFailover waits until the sentinels name a master other than old.
func (s *Sentinel) WaitFailover(old string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		addr, err := s.MasterAddr(ctx)
		cancel()
		if err == nil && addr != old {
			return addr, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("the sentinels still name %s as master after %s", old, within)
}

// waitSettled waits until every sentinel sees the replicas and the other
// sentinels.
func (s *Sentinel) waitSettled(replicas, others int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for _, sv := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sv.Addr()})
		for {
			m, err := c.Master(context.Background(), s.MasterName).Result()
			if err == nil && atoi(m["num-slaves"]) >= replicas && atoi(m["num-other-sentinels"]) >= others {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				return fmt.Errorf("sentinel %s: %v (%v)\n%s", sv.Addr(), m, err, sv.Log())
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return nil
}

// waitLinkUp waits until a replica has finished its first sync.
func waitLinkUp(r *Server, within time.Duration) error {
	deadline := time.Now().Add(within)
	c := redis.NewClient(r.options())
	defer c.Close()
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replication link not up after %s: %v %s", within, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
