package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/worker"
	"github.com/hibiken/asynq"
)

// fleet is a private Redis and a config file pointing at it.
type fleet struct {
	srv    *redistest.Server
	config string
	insp   *asynq.Inspector
}

const testConfig = `
redis: {url: %q}
worker:
  queues: {default: 1, critical: 3}
tasks:
  report:fetch:
    max_retry: 3
    timeout: 2m
    semaphore: {key: legacy-api, capacity: 5, ttl: 60s}
`

func newFleet(t *testing.T) *fleet {
	t.Helper()
	t.Setenv(config.EnvRedisURL, "")
	srv := redistest.Start(t)
	f := &fleet{srv: srv, config: writeConfig(t, fmt.Sprintf(testConfig, srv.URL()))}
	f.insp = asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr()})
	t.Cleanup(func() { _ = f.insp.Close() })
	return f
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// enqueue runs the command with --config and returns its exit code, stdout
// lines and stderr.
func (f *fleet) enqueue(t *testing.T, stdin string, args ...string) (int, []string, string) {
	t.Helper()
	return runCmd(t, stdin, append([]string{"--config", f.config}, args...)...)
}

func runCmd(t *testing.T, stdin string, args ...string) (int, []string, string) {
	t.Helper()
	var stdout, stderr strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := run(ctx, args, strings.NewReader(stdin), &stdout, &stderr)
	return code, strings.Fields(stdout.String()), stderr.String()
}

// assertNothingEnqueued checks that Redis holds no queue and no key.
func (f *fleet) assertNothingEnqueued(t *testing.T) {
	t.Helper()
	if qs, err := f.insp.Queues(); err != nil || len(qs) != 0 {
		t.Errorf("queues = %q, %v; want none", qs, err)
	}
	if n, err := f.srv.Client().DBSize(context.Background()).Result(); err != nil || n != 0 {
		t.Errorf("Redis holds %d keys (%v), want 0", n, err)
	}
}

func (f *fleet) task(t *testing.T, queue, id string) *asynq.TaskInfo {
	t.Helper()
	info, err := f.insp.GetTaskInfo(queue, id)
	if err != nil {
		t.Fatalf("GetTaskInfo(%s, %s): %v", queue, id, err)
	}
	return info
}

const acme = `{"tenant_id":"acme"}`

func TestBadInputExits2AndEnqueuesNothing(t *testing.T) {
	f := newFleet(t)
	tests := []struct {
		name    string
		stdin   string
		args    []string
		wantErr string
	}{
		{"unknown flag", "", []string{"--bogus", "report:fetch", acme}, "flag provided but not defined: -bogus"},
		{"bad flag value", "", []string{"--count", "many", "report:fetch", acme}, `invalid value "many" for flag -count`},
		{"missing type", "", nil, "missing TYPE"},
		{"too many args", "", []string{"report:fetch", acme, "{}"}, "too many arguments"},
		{"count zero", "", []string{"--count", "0", "report:fetch", acme}, "--count must be >= 1, got 0"},
		{"count with stdin", acme + "\n", []string{"--count", "2", "report:fetch"}, "--count needs a JSON argument"},
		{"negative max-retry", "", []string{"--max-retry", "-1", "report:fetch", acme}, "--max-retry must be >= 0"},
		{"zero timeout", "", []string{"--timeout", "0s", "report:fetch", acme}, "--timeout must be > 0"},
		{"short unique", "", []string{"--unique", "500ms", "report:fetch", acme}, "--unique must be at least 1s"},
		{"negative in", "", []string{"--in", "-1s", "report:fetch", acme}, "--in must not be negative"},
		{"queue not served", "", []string{"--queue", "bulk", "report:fetch", acme}, `queue "bulk" is not served by the fleet (worker.queues: critical, default)`},
		{"unknown type", "", []string{"report:fetsh", acme}, `unknown task type "report:fetsh": the config declares report:fetch (in `},
		{"demo type not declared", "", []string{"webhook:deliver", `{"tenant_id":"acme","url":"https://example.com/h","event":"invoice.paid"}`}, `unknown task type "webhook:deliver"`},
		{"malformed JSON", "", []string{"report:fetch", `{"tenant_id":`}, "invalid report:fetch payload: malformed JSON"},
		{"not an object", "", []string{"report:fetch", `acme`}, "invalid report:fetch payload: malformed JSON"},
		{"rejected payload", "", []string{"report:fetch", `{"tenant_id":""}`}, "invalid report:fetch payload: tenant_id: required"},
		{"unknown field", "", []string{"report:fetch", `{"tenant_id":"a","tenant":"b"}`}, `unknown field "tenant"`},
		{"empty stdin", "", []string{"report:fetch"}, "no JSON lines on stdin"},
		{"bad stdin lines", acme + "\n{\"tenant_id\":\"\"}\n\n" + acme + "\nnot json\n", []string{"report:fetch"},
			"2 bad stdin line(s); nothing enqueued:\n  line 2: invalid report:fetch payload: tenant_id: required\n  line 5: invalid report:fetch payload: malformed JSON"},
		{"stdin line too long", acme + "\n" + strings.Repeat("x", 70000) + "\n", []string{"report:fetch"}, "stdin line 2: longer than 65536 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, ids, stderr := f.enqueue(t, tt.stdin, tt.args...)
			if code != exitUsage || !strings.Contains(stderr, tt.wantErr) || len(ids) != 0 {
				t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant exit 2 and %q", code, ids, stderr, tt.wantErr)
			}
			f.assertNothingEnqueued(t)
		})
	}
}

func TestManyBadStdinLinesAreSummarised(t *testing.T) {
	f := newFleet(t)
	in := strings.Repeat("{}\n", 25) + acme + "\n"
	code, _, stderr := f.enqueue(t, in, "report:fetch")
	if code != exitUsage || !strings.Contains(stderr, "25 bad stdin line(s)") || !strings.Contains(stderr, "line 10:") ||
		strings.Contains(stderr, "line 11:") || !strings.Contains(stderr, "... and 15 more bad lines") {
		t.Errorf("exit %d, stderr:\n%s", code, stderr)
	}
	f.assertNothingEnqueued(t)
}

func TestConfigErrorsExit2(t *testing.T) {
	t.Setenv(config.EnvRedisURL, "")
	bad := writeConfig(t, "tasks:\n  report:fetch:\n    semaphore: {key: legacy-api, capacity: 0}\n")
	code, _, stderr := runCmd(t, "", "--config", bad, "report:fetch", acme)
	if code != exitUsage || !strings.Contains(stderr, `tasks["report:fetch"].semaphore.capacity: must be >= 1, got 0`) {
		t.Errorf("bad config: exit %d, stderr %s", code, stderr)
	}
	code, _, stderr = runCmd(t, "", "--config", filepath.Join(t.TempDir(), "missing.yaml"), "report:fetch", acme)
	if code != exitUsage || !strings.Contains(stderr, "missing.yaml") {
		t.Errorf("missing config: exit %d, stderr %s", code, stderr)
	}
}

func TestUnrenderableKeyTemplateExits2(t *testing.T) {
	srv := redistest.Start(t)
	t.Setenv(config.EnvRedisURL, "")
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {url: %q}
tasks:
  report:fetch:
    semaphores: [{key: legacy-api, capacity: 5}, {key: "region:{region}", capacity: 1}]
`, srv.URL()))
	code, _, stderr := runCmd(t, "", "--config", cfg, "report:fetch", acme)
	if code != exitUsage || !strings.Contains(stderr, `semaphore key: key template "region:{region}": payload field "region" is missing`) {
		t.Errorf("exit %d, stderr %s", code, stderr)
	}
	if n, _ := srv.Client().DBSize(context.Background()).Result(); n != 0 {
		t.Errorf("%d keys in Redis", n)
	}
}

func TestHelp(t *testing.T) {
	code, ids, stderr := runCmd(t, "", "-h")
	if code != exitOK || len(ids) != 0 || !strings.Contains(stderr, "usage: enqueue") || !strings.Contains(stderr, "webhook:deliver") || !strings.Contains(stderr, "-max-retry N") {
		t.Errorf("exit %d, stderr:\n%s", code, stderr)
	}
}

func TestEnqueueOne(t *testing.T) {
	f := newFleet(t)
	code, ids, stderr := f.enqueue(t, "", "report:fetch", ` {"tenant_id":"acme","duration_ms":5} `)
	if code != exitOK || len(ids) != 1 {
		t.Fatalf("exit %d, ids %q, stderr %s", code, ids, stderr)
	}
	info := f.task(t, "default", ids[0])
	if info.Type != "report:fetch" || string(info.Payload) != `{"tenant_id":"acme","duration_ms":5}` ||
		info.MaxRetry != 3 || info.Timeout != 2*time.Minute || info.State != asynq.TaskStatePending {
		t.Errorf("task = %+v", info)
	}
}

func TestEnqueueCount(t *testing.T) {
	f := newFleet(t)
	code, ids, stderr := f.enqueue(t, "", "report:fetch", acme, "--count", "5")
	if code != exitOK || len(ids) != 5 {
		t.Fatalf("exit %d, ids %q, stderr %s", code, ids, stderr)
	}
	if stderr != "" {
		t.Errorf("stderr is not a terminal, yet got %q", stderr)
	}
	pending, err := f.insp.ListPendingTasks("default")
	if err != nil || len(pending) != 5 {
		t.Fatalf("pending = %d, %v", len(pending), err)
	}
	var got []string
	for _, p := range pending {
		got = append(got, p.ID)
	}
	slices.Sort(got)
	slices.Sort(ids)
	if !slices.Equal(got, ids) || len(slices.Compact(slices.Clone(ids))) != 5 {
		t.Errorf("printed IDs %q, pending %q", ids, got)
	}
}

func TestEnqueueStdinLines(t *testing.T) {
	f := newFleet(t)
	in := `{"tenant_id":"t1"}` + "\r\n\n" + `{"tenant_id":"t2","report":"r"}` + "\n   \n" + `{"tenant_id":"t3"}`
	code, ids, stderr := f.enqueue(t, in, "report:fetch")
	if code != exitOK || len(ids) != 3 {
		t.Fatalf("exit %d, ids %q, stderr %s", code, ids, stderr)
	}
	for i, want := range []string{`{"tenant_id":"t1"}`, `{"tenant_id":"t2","report":"r"}`, `{"tenant_id":"t3"}`} {
		if got := string(f.task(t, "default", ids[i]).Payload); got != want {
			t.Errorf("task %d payload %s, want %s", i, got, want)
		}
	}
}

func TestEnqueueFlagsOverrideConfig(t *testing.T) {
	f := newFleet(t)
	args := []string{"report:fetch", acme, "--queue", "critical", "--in", "1h", "--max-retry", "0", "--timeout", "30s", "--unique", "1m"}
	code, ids, stderr := f.enqueue(t, "", args...)
	if code != exitOK || len(ids) != 1 {
		t.Fatalf("exit %d, ids %q, stderr %s", code, ids, stderr)
	}
	info := f.task(t, "critical", ids[0])
	if info.Queue != "critical" || info.MaxRetry != 0 || info.Timeout != 30*time.Second || info.State != asynq.TaskStateScheduled ||
		time.Until(info.NextProcessAt) < 50*time.Minute {
		t.Errorf("task = %+v", info)
	}

	// The same task again within --unique: skipped, not an error.
	code, ids, stderr = f.enqueue(t, "", args...)
	if code != exitOK || len(ids) != 0 || !strings.Contains(stderr, "duplicate") {
		t.Errorf("duplicate: exit %d, ids %q, stderr %s", code, ids, stderr)
	}

	// "--" ends the flags.
	code, ids, stderr = f.enqueue(t, "", "--max-retry", "1", "--", "report:fetch", acme)
	if code != exitOK || len(ids) != 1 || f.task(t, "default", ids[0]).MaxRetry != 1 {
		t.Errorf("with --: exit %d, ids %q, stderr %s", code, ids, stderr)
	}
}

// TestDeclaredTypesAreChecked: a demo type the config declares gets its
// payload checked, a type of the user's own it declares is enqueued
// without a check (enqueue knows no validator for it).
func TestDeclaredTypesAreChecked(t *testing.T) {
	t.Setenv(config.EnvRedisURL, "")
	srv := redistest.Start(t)
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {url: %q}
tasks:
  webhook:deliver: {max_retry: 4}
  image:resize: {}
`, srv.URL()))
	code, _, stderr := runCmd(t, "", "--config", cfg, "webhook:deliver", `{"tenant_id":"acme"}`)
	if code != exitUsage || !strings.Contains(stderr, "invalid webhook:deliver payload") {
		t.Errorf("rejected demo payload: exit %d, stderr %s", code, stderr)
	}
	code, ids, stderr := runCmd(t, "", "--config", cfg, "webhook:deliver", `{"tenant_id":"acme","url":"https://example.com/h","event":"invoice.paid"}`)
	if code != exitOK || len(ids) != 1 || stderr != "" {
		t.Fatalf("demo type: exit %d, ids %q, stderr %s", code, ids, stderr)
	}
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr()})
	defer insp.Close()
	if info, err := insp.GetTaskInfo("default", ids[0]); err != nil || info.MaxRetry != 4 {
		t.Errorf("task = %+v, %v; want max_retry 4 (configured)", info, err)
	}
	code, ids, stderr = runCmd(t, "", "--config", cfg, "image:resize", `{"any":"payload"}`)
	if code != exitOK || len(ids) != 1 || stderr != "" {
		t.Errorf("a type of the user's own: exit %d, ids %q, stderr %s", code, ids, stderr)
	}
}

func TestRedisUnreachableExits1(t *testing.T) {
	t.Setenv(config.EnvRedisURL, "")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(redistest.FreePort(t)))
	cfg := writeConfig(t, fmt.Sprintf("redis: {url: %q}\ntasks: {report:fetch: {}}\n", "redis://"+addr))
	code, ids, stderr := runCmd(t, "", "--config", cfg, "report:fetch", acme)
	if code != exitFailure || len(ids) != 0 || !strings.Contains(stderr, "cannot reach Redis") {
		t.Errorf("exit %d, ids %q, stderr %s", code, ids, stderr)
	}

	cfg = writeConfig(t, fmt.Sprintf("redis: {embedded_addr: %q}\ntasks: {report:fetch: {}}\n", addr))
	code, _, stderr = runCmd(t, "", "--config", cfg, "report:fetch", acme)
	if code != exitFailure || !strings.Contains(stderr, "is a worker running?") {
		t.Errorf("embedded: exit %d, stderr %s", code, stderr)
	}
}

func TestEnqueueToEmbeddedRedis(t *testing.T) {
	t.Setenv(config.EnvRedisURL, "")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(redistest.FreePort(t)))
	m, err := worker.StartEmbedded(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cfg := writeConfig(t, fmt.Sprintf("redis: {embedded_addr: %q}\ntasks: {report:fetch: {}}\n", addr))
	code, ids, stderr := runCmd(t, "", "--config", cfg, "report:fetch", acme)
	if code != exitOK || len(ids) != 1 {
		t.Fatalf("exit %d, ids %q, stderr %s", code, ids, stderr)
	}
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: addr})
	defer insp.Close()
	if info, err := insp.GetTaskInfo("default", ids[0]); err != nil || info.Type != "report:fetch" {
		t.Errorf("task = %+v, %v", info, err)
	}
}

// TestMaxWaitingExits2: once a cap's max_waiting tasks wait for its key,
// enqueue stops with exit 2 and a message naming the key: in bulk, after
// printing the IDs of the tasks it enqueued before; alone, enqueueing
// nothing. (No worker runs: of a cap of one seat and max_waiting 2, one
// task holds the standby place and one is parked.)
func TestMaxWaitingExits2(t *testing.T) {
	t.Setenv(config.EnvRedisURL, "")
	srv := redistest.Start(t)
	cfg := writeConfig(t, fmt.Sprintf("redis: {url: %q}\ntasks: {job: {semaphore: {key: bounded, capacity: 1, max_waiting: 2}}}\n", srv.URL()))
	const full = `producer: enqueue job: 2 tasks wait for semaphore "bounded", its max_waiting is 2`
	code, ids, stderr := runCmd(t, "", "--config", cfg, "--count", "5", "job", "{}")
	if code != exitFull || len(ids) != 2 || !strings.Contains(stderr, "enqueue: enqueued 2 of 5 tasks, then stopped: "+full) {
		t.Errorf("bulk: exit %d, ids %q, stderr:\n%s\nwant exit 2, two IDs and %q", code, ids, stderr, full)
	}
	code, more, stderr := runCmd(t, "", "--config", cfg, "job", "{}")
	if code != exitFull || len(more) != 0 || stderr != "enqueue: not enqueued: "+full+"\n" {
		t.Errorf("one: exit %d, ids %q, stderr:\n%s\nwant exit 2, no ID and %q", code, more, stderr, full)
	}
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr()})
	defer insp.Close()
	qi, err := insp.GetQueueInfo("default")
	if err != nil || qi.Size != len(ids) {
		t.Errorf("queue %+v, %v: want the %d tasks enqueued, no more", qi, err, len(ids))
	}
}
