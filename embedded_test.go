package fleetcap_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
)

// terminate sends SIGTERM and waits up to within for the process to exit;
// it returns the exit error (nil for exit code 0).
func (p *process) terminate(within time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.end:
		return p.err
	case <-time.After(within):
		return fmt.Errorf("still running %s after SIGTERM", within)
	}
}

// startWorker starts the worker binary and waits until it prints its
// pages; it returns the process and the monitoring server's base URL.
func startWorker(t *testing.T, env []string, config string) (*process, string) {
	t.Helper()
	w := startProcess(t, env, workerBin, "--config", config)
	var base string
	waitfor.Condition(t, 30*time.Second, "the worker prints its pages", func() bool {
		m := regexp.MustCompile(`metrics:\s+(http://\S+)/metrics`).FindStringSubmatch(w.Output())
		if m != nil {
			base = m[1]
		}
		return m != nil
	})
	return w, base
}

// TestEmbeddedKeepsTasksAcrossRestart runs the worker binary on the
// embedded default (no redis.url): a backlog enqueued with the enqueue
// command, SIGTERM while two tasks run and outlast shutdown_timeout (asynq
// requeues them), and a second start finds every task that had not
// finished: the scheduled ones by ID at once, and the rest all finish,
// none lost, failed or archived. A corrupt or unreadable file then stops
// the worker with exit code 2 and a message naming it, and stays as it was.
func TestEmbeddedKeepsTasksAcrossRestart(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(redistest.FreePort(t)))
	cfg := writeFile(t, "config.yaml", fmt.Sprintf(`redis:
  embedded_addr: %q
worker:
  concurrency: 4
  shutdown_timeout: 1s
monitoring:
  addr: 127.0.0.1:0
tasks:
  report:fetch:
    max_retry: 3
    semaphore: {key: legacy-api, capacity: 2, ttl: 5s}
`, addr))
	file := filepath.Join(filepath.Dir(cfg), ".fleetcap", "embedded.json") // the default, beside the config
	env := []string{"FLEETCAP_REDIS_URL="}
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: addr})
	t.Cleanup(func() { _ = insp.Close() })
	queue := func() *asynq.QueueInfo {
		info, err := insp.GetQueueInfo("default")
		if err != nil {
			return &asynq.QueueInfo{}
		}
		return info
	}

	w, _ := startWorker(t, env, cfg)
	if !strings.Contains(w.Output(), "kept in:    "+file) {
		t.Errorf("the worker does not say where it keeps its data (%s):\n%s", file, w.Output())
	}
	const backlog, later = 12, 3
	code, stdout, stderr := runCmd(t, nil, env, enqueueBin, "--config", cfg, "--count", strconv.Itoa(backlog), "report:fetch", `{"tenant_id":"acme","duration_ms":1500}`)
	if code != 0 || len(strings.Fields(stdout)) != backlog {
		t.Fatalf("enqueue: exit %d, %q, %s", code, stdout, stderr)
	}
	code, stdout, stderr = runCmd(t, nil, env, enqueueBin, "--config", cfg, "--in", "1h", "--count", strconv.Itoa(later), "report:fetch", `{"tenant_id":"acme"}`)
	scheduled := strings.Fields(stdout)
	if code != 0 || len(scheduled) != later {
		t.Fatalf("enqueue --in 1h: exit %d, %q, %s", code, stdout, stderr)
	}
	waitfor.Condition(t, 20*time.Second, "two tasks running", func() bool { return queue().Active == 2 })
	if err := w.terminate(20 * time.Second); err != nil {
		t.Fatalf("worker stop: %v\n%s", err, w.Output())
	}
	if !strings.Contains(w.Output(), "embedded redis saved") {
		t.Errorf("the worker does not say it saved:\n%s", w.Output())
	}
	if strings.Contains(w.Output(), "failed to dial") {
		t.Errorf("a client of the worker still dialled the embedded Redis after it stopped:\n%s", w.Output())
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("no file after the stop: %v", err)
	}

	w, _ = startWorker(t, env, cfg)
	for _, id := range scheduled {
		if info, err := insp.GetTaskInfo("default", id); err != nil || info.State != asynq.TaskStateScheduled {
			t.Errorf("scheduled task %s after the restart: %+v, %v", id, info, err)
		}
	}
	waitfor.Condition(t, 60*time.Second, "the backlog finishes after the restart", func() bool {
		q := queue()
		return q.ProcessedTotal >= backlog && q.Pending == 0 && q.Active == 0 && q.Retry == 0
	})
	if q := queue(); q.ProcessedTotal != backlog || q.FailedTotal != 0 || q.Archived != 0 || q.Scheduled != later {
		t.Errorf("after the restart: processed %d (want %d over both runs), failed %d, archived %d, scheduled %d (want %d)",
			q.ProcessedTotal, backlog, q.FailedTotal, q.Archived, q.Scheduled, later)
	}
	if err := w.terminate(20 * time.Second); err != nil {
		t.Fatalf("worker stop: %v\n%s", err, w.Output())
	}

	// A corrupt file, and one that cannot be read (a directory): exit 2,
	// the file named, and left as it was.
	corrupt := []byte(`{"format":"fleetcap-embedded-redis","version":1,"databases":[{"db":0,"ke`)
	if err := os.WriteFile(file, corrupt, 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCmd(t, nil, env, workerBin, "--config", cfg)
	if code != 2 || !strings.Contains(stderr, "redis.embedded_file "+file+": cannot load it") {
		t.Errorf("corrupt file: exit %d, stderr:\n%s", code, stderr)
	}
	if got, _ := os.ReadFile(file); string(got) != string(corrupt) {
		t.Errorf("the corrupt file was changed to %q", got)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(file, 0o700); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCmd(t, nil, env, workerBin, "--config", cfg)
	if code != 2 || !strings.Contains(stderr, "redis.embedded_file "+file+": cannot load it") {
		t.Errorf("unreadable file: exit %d, stderr:\n%s", code, stderr)
	}
}
