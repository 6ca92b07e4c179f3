// Deployment tests: the fleet (probe worker processes), the enqueue command
// and the semaphore, end to end, on a Redis Cluster, on Redis Sentinel with
// a failover mid-run, and on TLS with an ACL user. The probes count
// themselves in a plain Redis of their own.
package fleetcap_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
)

// reportConfig is a fleet config serving report:fetch under the cap
// legacy-api, with redisYAML as its redis section.
func reportConfig(redisYAML string, concurrency, capacity int) string {
	return fmt.Sprintf(`redis:
%s
worker:
  concurrency: %d
  queues: {default: 1}
  shutdown_timeout: 5s
monitoring:
  addr: 127.0.0.1:0
tasks:
  report:fetch:
    queue: default
    max_retry: 3
    timeout: 1m
    semaphore:
      key: legacy-api
      capacity: %d
      mode: requeue
      ttl: 5s
      wait_timeout: 5s
`, redisYAML, concurrency, capacity)
}

// enqueueCLI runs the enqueue command and returns the task IDs it printed.
func enqueueCLI(t *testing.T, env []string, config string, args ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, enqueueBin, append([]string{"--config", config}, args...)...)
	cmd.Env = append(cmd.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("enqueue %q: %v\n%s", args, err, stderr.String())
	}
	return strings.Fields(stdout.String())
}

// runReports enqueues n report:fetch tasks of ms milliseconds with the
// enqueue command.
func runReports(t *testing.T, f *fleet, n, ms int) {
	t.Helper()
	ids := enqueueCLI(t, f.env, f.config, "--count", fmt.Sprint(n), "report:fetch", fmt.Sprintf(`{"tenant_id":"acme","duration_ms":%d}`, ms))
	if len(ids) != n {
		t.Fatalf("enqueue printed %d task IDs, want %d", len(ids), n)
	}
}

func TestDeployCluster(t *testing.T) {
	const capacity, tasks = 3, 60
	cluster := redistest.StartCluster(t, 3)
	counters := redistest.Start(t)
	redisYAML := fmt.Sprintf("  cluster_addrs: [%s]", strings.Join(cluster.Addrs(), ", "))
	f := newFleet(t, nil, asynq.RedisClusterClientOpt{Addrs: cluster.Addrs()}, reportConfig(redisYAML, 4, capacity), counters, 3)
	runReports(t, f, tasks, 100)
	ctx := context.Background()
	if err := f.counters.WaitDone(ctx, tasks, 60*time.Second, f.procsAlive()); err != nil {
		t.Fatal(err)
	}
	f.check(ctx, tasks, capacity)
	peak, _ := f.counters.MaxInflight(ctx)
	t.Logf("cluster of %d masters: %d tasks, max inflight %d (cap %d)", len(cluster.Nodes), tasks, peak, capacity)
}

func TestDeploySentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a sentinel failover")
	}
	const capacity, tasks = 3, 90
	s := redistest.StartSentinel(t, 1, 3)
	counters := redistest.Start(t)
	conn := asynq.RedisFailoverClientOpt{MasterName: s.MasterName, SentinelAddrs: s.Addrs()}
	f := newFleet(t, nil, conn, reportConfig(fmt.Sprintf("  url: %q", s.URL()), 4, capacity), counters, 3)
	runReports(t, f, tasks, 150)
	ctx := context.Background()
	if err := f.counters.WaitDone(ctx, 15, 60*time.Second, f.procsAlive()); err != nil {
		t.Fatal(err)
	}
	old := s.Master.Addr()
	s.Master.Kill()
	killed := time.Now()
	now, err := s.WaitFailover(old, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover from %s to %s in %s", old, now, time.Since(killed).Round(time.Millisecond))
	doneAtFailover, _ := f.counters.Done(ctx)
	// The fleet goes on after the failover, and the enqueue command finds
	// the new master through the sentinels.
	runReports(t, f, 15, 150)
	if err := f.counters.WaitDone(ctx, tasks+15, 90*time.Second, f.procsAlive()); err != nil {
		if info, err := f.insp.GetQueueInfo("default"); err == nil {
			t.Logf("queue: %+v", info)
		}
		t.Fatal(err)
	}
	t.Logf("%d of %d tasks were done at the failover; all done %s after the master was killed",
		doneAtFailover, tasks+15, time.Since(killed).Round(time.Millisecond))
	f.check(ctx, tasks+15, capacity)
	peak, _ := f.counters.MaxInflight(ctx)
	runs, _ := f.counters.Runs(ctx)
	t.Logf("sentinel: max inflight %d (cap %d), %d finished runs for %d tasks", peak, capacity, runs, tasks+15)
}

func TestDeployTLS(t *testing.T) {
	const capacity, tasks = 3, 45
	// Workers present no client certificate (fleetcap's config has no
	// setting for one): the server checks its clients by the ACL user.
	s := redistest.StartTLS(t, "fleet", "tls-acl-pw-7c1d", false)
	counters := redistest.Start(t)
	conn := asynq.RedisClientOpt{Addr: s.Addr(), Username: s.Username, Password: s.Password, TLSConfig: s.TLSConfig()}
	// The workers and the enqueue command trust the test CA through
	// SSL_CERT_FILE, as they would trust a private CA in production.
	f := newFleet(t, nil, conn, reportConfig(fmt.Sprintf("  url: %q", s.URL()), 4, capacity), counters, 3, "SSL_CERT_FILE="+s.CAFile)
	runReports(t, f, tasks, 100)
	ctx := context.Background()
	if err := f.counters.WaitDone(ctx, tasks, 60*time.Second, f.procsAlive()); err != nil {
		t.Fatal(err)
	}
	f.check(ctx, tasks, capacity)
	peak, _ := f.counters.MaxInflight(ctx)
	t.Logf("TLS + ACL: %d tasks, max inflight %d (cap %d)", tasks, peak, capacity)
	for _, p := range f.procs {
		if strings.Contains(p.Log(), s.Password) {
			t.Errorf("%s logged the Redis password", p.Name)
		}
	}
}
